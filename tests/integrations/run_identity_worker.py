"""One rank of a real 3-rank gloo job agreeing on run ids; launched by test_run_identity.py
through ``python -m torch.distributed.run``. Writes ``rank<R>.json`` into argv[1]."""

from __future__ import annotations

import json
import os
import sys

import torch.distributed as dist

from laggard.integrations.run_identity import agree_run, resolve_run


def main(out_dir: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    made = agree_run(resolve_run(None, {}), dist)  # nothing named: rank 0 makes one
    differing = agree_run(f"rank{rank}-env", dist)  # environments that disagree: rank 0 wins
    from_env = agree_run(resolve_run(None, os.environ), dist)  # torchrun's rendezvous id
    subgroup = dist.new_group([1, 2])
    sub = agree_run(f"sub{rank}", dist, subgroup) if rank in (1, 2) else None
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump({"made": made, "differing": differing, "from_env": from_env, "sub": sub,
                   "elastic": os.environ.get("TORCHELASTIC_RUN_ID")}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
    sys.stdout.flush()  # torn down: now skip the C++ static destructors, where gloo's
    os._exit(0)  # threads abort a rank 1 run in 20 (ENVIRONMENT.md; demo/worker.py)
