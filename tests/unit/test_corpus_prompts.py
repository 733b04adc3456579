"""The code prompts the EAGLE-3 head's self-distillation data starts from (torch-free)."""

from trtspec.corpus import code_request_prompts

SRC = '''import os


def first(items):
    """Return the first item."""
    return items[0]


class Box:
    \'\'\'A box.

    It holds one thing.
    \'\'\'

    def __init__(self, thing):
        self.thing = thing

    async def get(self):
        """The thing."""
        return self.thing

def no_doc(x):
    return x
'''


def test_prompts_end_where_the_body_begins():
    ps = code_request_prompts([SRC], 10, min_chars=10, max_chars=400)
    assert len(ps) == 3  # first, Box, get: no_doc has no docstring
    ends = sorted(p.rstrip("\n").splitlines()[-1].strip() for p in ps)
    assert ends == ['"""Return the first item."""', '"""The thing."""', "'''"]
    for p in ps:
        assert p.endswith("\n") and SRC.find(p) >= 0  # a contiguous cut of the text
        assert p.lstrip().startswith(p.lstrip().splitlines()[0])  # starts at a line start
        assert SRC[SRC.find(p) - 1] == "\n" or SRC.find(p) == 0


def test_prompts_are_deterministic_and_seeded():
    texts = [SRC, SRC.replace("first", "last").replace("items[0]", "items[-1]")]
    a = code_request_prompts(texts, 4, seed=1, min_chars=10, max_chars=400)
    assert a == code_request_prompts(texts, 4, seed=1, min_chars=10, max_chars=400)
    assert len(a) == 4  # of 6 definitions with a docstring
    assert sorted(a) != sorted(code_request_prompts(texts, 4, seed=2, min_chars=10, max_chars=400))


def test_a_definition_longer_than_max_chars_is_skipped():
    long_doc = 'def f():\n    """' + "x" * 500 + '"""\n    return 1\n'
    assert code_request_prompts([long_doc], 5, max_chars=300) == []
    assert len(code_request_prompts([long_doc], 5, max_chars=900)) == 1
