"""Hooks of scripts/schemathesis.sh.

A sale may ask for up to 600 000 ms of simulated work and of pause per
purchase (`work_ms`, `pause_ms`): the slow-holder demonstrations need it. A
purchase of such a sale outlasts the request timeout and is answered
`504 timeout` by design, which the fuzzer would count as a server error. So
the sales that the fuzzer creates simulate at most MAX_SIMULATED_MS of each:
a larger value that the API accepts is lowered before the request is sent.
Values outside the accepted range are sent as generated, so the refusal of
invalid knobs is still fuzzed.
"""

import schemathesis

MAX_SIMULATED_MS = 1000
ACCEPTED_MAX_MS = 600_000


@schemathesis.hook
def before_call(context, case, kwargs):
    if case.method.upper() != "POST" or case.path != "/admin/sales":
        return
    if not isinstance(case.body, dict):
        return
    for knob in ("work_ms", "pause_ms"):
        value = case.body.get(knob)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if value == int(value) and MAX_SIMULATED_MS < value <= ACCEPTED_MAX_MS:
            case.body[knob] = MAX_SIMULATED_MS
