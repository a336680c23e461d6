"""The checks of a text generation request's fields (PUT /api, inference/server.py), shared with its command-line
client (tools/text_generation_cli.py), which checks its flags with them before it sends anything. No torch here:
the client starts without it."""
from __future__ import annotations

SEED_LIMIT = 2 ** 64       # torch.Generator.manual_seed takes 0 <= seed < 2**64


def is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


# {field: (valid, what it must be)}: the checks of a request's fields besides prompts
FIELD_CHECKS = {
    "tokens_to_generate": (lambda v: is_int(v) and v >= 0, "an integer >= 0"),
    "logprobs": (lambda v: isinstance(v, bool), "a boolean"),
    "temperature": (lambda v: is_number(v) and 0.0 < v <= 100.0, "a number in (0, 100]"),
    "top_k": (lambda v: is_int(v) and 0 <= v <= 1000, "an integer in [0, 1000]"),
    "top_p": (lambda v: is_number(v) and 0.0 <= v <= 1.0, "a number in [0, 1]"),
    "add_BOS": (lambda v: isinstance(v, bool), "a boolean"),
    "random_seed": (lambda v: is_int(v) and -1 <= v < SEED_LIMIT, "an integer in [0, 2**64) (or -1: a fresh seed)"),
    "no_log": (lambda v: isinstance(v, bool), "a boolean"),
    "stop_token": (is_int, "an integer"),
    "length_penalty": (is_number, "a number"),
}
