"""What runs in the CLI process: the tritonserver launcher, its watchdog and the MPI launch plans.

Nothing here runs inside the server, and nothing here imports torch.
"""
