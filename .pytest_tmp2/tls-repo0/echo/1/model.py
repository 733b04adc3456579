
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            text = pb_utils.get_input_tensor_by_name(r, "text_input").as_numpy().reshape(-1)[0]
            reply = np.array([b"echo: " + text], dtype=np.object_)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("text_output", reply)]))
        return out
