"""Refresh the warm starts that ship with the package (lrl/shipped/), for maintainers.

    python -m lrl_lab.tools.ship_bases            # build (or take from the cache) every built-in base, copy it in
    python -m lrl_lab.tools.ship_bases --check    # exit 1 when a shipped base is missing or stale

A shipped base is the exact policy its warm start builds: its folder is named by the warm start's cache key,
which covers the configuration, the vocabulary, the model size and the code that draws the demonstrations, so
a change to any of them leaves the old copy unused (and this check failing) until the base is rebuilt.
"""

from __future__ import annotations

import argparse
import shutil
import sys

from lrl.policy import save_policy
from lrl.warmstart import SHIPPED, cache_dir


def expected() -> dict[str, tuple]:
    """Folder name -> (tokenizer, builder) of every built-in base."""
    from lrl.envs.codefix import codefix_tokenizer
    from lrl.envs.codefix.base import RL_BASE as CODEFIX
    from lrl.envs.review import review_tokenizer
    from lrl.envs.review.base import RL_BASE as REVIEW
    from lrl.envs.tinyagent import build_tokenizer, make_tasks
    from lrl.envs.tinyagent.base import RL_BASE as TINYAGENT

    built = (
        (CODEFIX, codefix_tokenizer()),
        (TINYAGENT, build_tokenizer(make_tasks("all"))),
        (REVIEW, review_tokenizer()),
    )
    return {base.folder(tok): (tok, lambda base=base, tok=tok: base.policy(tok, verbose=True)) for base, tok in built}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--check", action="store_true", help="only check that every shipped base is current")
    args = parser.parse_args(argv)
    want = expected()
    have = {p.name for p in SHIPPED.iterdir()} if SHIPPED.is_dir() else set()
    if args.check:
        missing, stale = sorted(set(want) - have), sorted(have - set(want))
        for name in missing:
            print(f"missing: {name}")
        for name in stale:
            print(f"stale: {name}")
        return 1 if missing or stale else 0
    SHIPPED.mkdir(exist_ok=True)
    for name in have - set(want):
        shutil.rmtree(SHIPPED / name)
        print(f"removed stale {name}")
    for name, (tok, build) in want.items():
        if name in have:
            continue
        model = build()  # from the cache when it is there
        if not (cache_dir() / name).exists():
            save_policy(model, tok, cache_dir() / name)
        shutil.copytree(cache_dir() / name, SHIPPED / name)
        print(f"shipped {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
