"""An environment worker: a process that runs sandboxed test runs, one at a time, for the pool that started it.

Protocol, JSON lines: the first line on stdin is the setup (``root``, ``level``, ``limits``, ``uid``, and from
the pool's probe ``own_root`` and ``plan``); the worker answers ``{"ready": true, ...}`` (or ``{"ready": false,
"error": ...}``). Then each request ``{"id", "files", "module", "calls", "expect", "name"}`` is answered ``{"id",
"verdict"}``. A sandbox's crash, hang, memory blow-up or garbled report is its verdict; the worker itself only
fails on its own (it ran out of memory: ``harness_oom``). It adopts whatever its runs leave behind (a child
subreaper) and kills it at each run's end. It exits when its stdin closes (the pool closed it, or the process
that started it died), removing its folder.

Standard library only (run as ``python -I -S worker.py``): it starts in milliseconds, without torch.
"""

import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(HERE)))))  # lrl's folder

import fsroot  # noqa: E402
import harness  # noqa: E402
import levels  # noqa: E402

from lrl.reaper import remove_tree  # noqa: E402

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
        harness.adopt_orphans()
        if setup.get("probe"):  # the pool's first worker finds out which level works here
            box, notes = levels.choose(setup["level"], root, limits, setup.get("uid"))
        else:
            plan = fsroot.Plan.from_dict(setup["plan"]) if setup.get("plan") else None
            box = harness.Sandbox(root, setup["level"], limits, setup.get("uid"), own_root=setup["own_root"],
                                  plan=plan)  # fmt: skip
            notes = []
        plan = box.plan.to_dict() if box.plan else None
        ready = {"ready": True, "level": box.level, "uid": box.uid, "own_root": box.own_root, "plan": plan}
        out.write(json.dumps({**ready, "notes": notes}) + "\n")
        out.flush()
        for line in sys.stdin:
            request = json.loads(line)
            out.write(json.dumps({"id": request["id"], "verdict": answer(box, request).to_dict()}) + "\n")
            out.flush()
    except BaseException as err:  # noqa: BLE001 (the pool reads this line, or sees the worker gone)
        try:
            out.write(json.dumps({"ready": False, "error": f"{type(err).__name__}: {err}"}) + "\n")
            out.flush()
        except OSError:
            pass
    finally:
        if root:
            remove_tree(root)
            try:
                os.rmdir(os.path.dirname(root))  # the pool's folder, once its last worker is gone
            except OSError:
                pass


def answer(box, request: dict):
    """One request's verdict. Whatever a candidate does is judged in the harness; an exception here is the
    harness's own failure, an infrastructure verdict, and the worker goes on to the next request."""
    try:
        return harness.run(
            box,
            request["files"],
            request["module"],
            request["calls"],
            request["expect"],
            request.get("name", "run"),
        )
    except MemoryError:
        return harness.Verdict(harness.HARNESS_OOM, detail="the environment worker ran out of memory")
    except OSError as err:
        return harness.Verdict(harness.START_FAILED, detail=f"the sandbox could not start: {err}")
    except Exception as err:  # noqa: BLE001
        return harness.Verdict(
            harness.START_FAILED, detail=f"the harness failed: {type(err).__name__}: {err}"
        )


if __name__ == "__main__":
    main()
