"""An environment worker: a process that runs sandboxed test runs, one at a time, for the pool that started it.

Protocol, JSON lines: the first line on stdin is the setup (``root``, ``level``, ``limits``, ``uid``); the worker
answers ``{"ready": true}`` (or ``{"ready": false, "error": ...}``). Then each request ``{"id", "files",
"module", "calls", "expect", "name"}`` is answered ``{"id", "verdict"}``. A sandbox's crash, hang or memory
blow-up is its verdict; the worker itself only fails on its own (it ran out of memory: ``harness_oom``). It
exits when its stdin closes (the pool closed it, or the process that started it died), removing its folder.

Standard library only (run as ``python -I -S worker.py``): it starts in milliseconds, without torch.
"""

import json
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import harness  # noqa: E402

USAGE = "usage: python -I -S worker.py   (started by lrl.envs.codefix.pool: setup and requests on stdin)"


def main() -> None:
    if sys.argv[1:]:
        print(USAGE + "\n\n" + __doc__.strip())
        sys.exit(0 if sys.argv[1:] in (["-h"], ["--help"]) else 2)
    out = sys.stdout
    setup = json.loads(sys.stdin.readline() or "{}")
    root = setup.get("root")
    try:
        os.makedirs(os.path.join(root, "python"), mode=0o755, exist_ok=True)
        os.chmod(root, 0o711)
        limits = harness.Limits(**setup["limits"])
        if setup.get("probe"):  # the pool's first worker finds out which level works here
            box, notes = harness.choose(setup["level"], root, limits, setup.get("uid"))
        else:
            box, notes = harness.Sandbox(root, setup["level"], limits, setup.get("uid")), []
        out.write(json.dumps({"ready": True, "level": box.level, "uid": box.uid, "notes": notes}) + "\n")
        out.flush()
        for line in sys.stdin:
            request = json.loads(line)
            try:
                verdict = harness.run(
                    box, request["files"], request["module"], request["calls"], request["expect"],
                    request.get("name", "run"),
                )  # fmt: skip
            except MemoryError:
                verdict = harness.Verdict(
                    harness.HARNESS_OOM, detail="the environment worker ran out of memory"
                )
            except OSError as err:
                verdict = harness.Verdict(harness.START_FAILED, detail=f"the sandbox could not start: {err}")
            out.write(json.dumps({"id": request["id"], "verdict": verdict.to_dict()}) + "\n")
            out.flush()
    except BaseException as err:  # noqa: BLE001 (the pool reads this line, or sees the worker gone)
        try:
            out.write(json.dumps({"ready": False, "error": f"{type(err).__name__}: {err}"}) + "\n")
            out.flush()
        except OSError:
            pass
    finally:
        if root:
            shutil.rmtree(root, ignore_errors=True)
            try:
                os.rmdir(os.path.dirname(root))  # the pool's folder, once its last worker is gone
            except OSError:
                pass


if __name__ == "__main__":
    main()
