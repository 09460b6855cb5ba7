"""The program that runs inside a sandbox: import the candidate module, evaluate the test calls, report values.

Run as ``python -I -S -B runner.py MODULE`` in the sandbox folder. The calls arrive on stdin as a JSON list of
expression strings (``"clamp(-3, 0, 5)"``). Each is evaluated against the module's namespace and its value goes
to file descriptor 3 as one JSON line, ``{"i": k, "value": v}`` or ``{"i": k, "raised": "ValueError"}``, then
``{"done": n}``. This program never sees the expected values and never says whether a test passed: the
harness compares the reported values with its own copy of the expectations, outside the sandbox. Whatever the
candidate does to this process (exit early, print, monkeypatch this file's functions, write to fd 3 itself) can
only make the report wrong or incomplete, never turn a wrong value into a right one.

Standard library only; it must start in a few milliseconds.
"""

import importlib
import json
import os
import sys

USAGE = "usage: python -I -S -B runner.py MODULE   (in a sandbox folder: calls on stdin, values on fd 3)"


def main() -> None:
    if len(sys.argv) != 2 or sys.argv[1] in ("-h", "--help"):
        print(USAGE + "\n\n" + __doc__.strip())
        sys.exit(0 if sys.argv[1:] in (["-h"], ["--help"]) else 2)
    module_name = sys.argv[1]
    calls = json.loads(sys.stdin.read())
    channel = os.fdopen(3, "w", buffering=1)
    sys.path.insert(0, os.getcwd())
    module = importlib.import_module(module_name)
    scope = dict(vars(module))
    for i, call in enumerate(calls):
        try:
            # compiled first: eval of a string marks a KeyboardInterrupt it raises as unhandled, and the
            # interpreter would then end by SIGINT after reporting every value
            value = eval(compile(call, f"call {i}", "eval"), scope)  # noqa: S307 (the task's own test expression)
            line = json.dumps({"i": i, "value": value}, allow_nan=False)
        except BaseException as err:  # noqa: BLE001 (a raised case is a value to report, SystemExit included)
            line = json.dumps({"i": i, "raised": type(err).__name__})
        channel.write(line + "\n")
    channel.write(json.dumps({"done": len(calls)}) + "\n")
    channel.flush()


if __name__ == "__main__":
    main()
