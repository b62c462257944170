"""Schemathesis hooks for tests/test_real_clients.py, loaded with SCHEMATHESIS_HOOKS=clients.schemathesis_hooks.

The schema says `model` is a string, so schemathesis sends random names, and every generation request ends at the
404 for an unknown model (vLLM's answer too) before it reaches the parts worth fuzzing. Each body that is a JSON
object gets the served model's name instead; everything else schemathesis generates goes out as it made it."""

import os

import schemathesis


@schemathesis.hook
def before_call(context, case, kwargs):
    if isinstance(case.body, dict) and "model" in case.body:
        case.body["model"] = os.environ["ROSELLM_SERVED_MODEL"]
