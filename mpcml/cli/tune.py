"""`mpcml tune JOBFILE --calibration FILE`: the cheapest approximation plan within a budget.

It runs here, on the calibration rows and the model's weights (`--weights`, a state_dict, for
a private or trained model; else the job's initial weights): nothing is sent anywhere. It
prints the plan with its predicted cost against CrypTen's choices and the metric change, and
writes the plan file a job names with `approximations = "FILE"`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from mpcml.cli.exits import EXIT_BAD_INPUT, EXIT_OK


def add_parser(sub: Any) -> None:
    """The `tune` command."""
    p = sub.add_parser("tune", help="choose the cheapest approximation plan within a budget")
    p.add_argument("jobfile", help="the job file whose [model] to tune")
    p.add_argument(
        "--calibration",
        required=True,
        help=".npz with rows `x` (and labels `y`), yours; for a transformer, `x` holds token ids "
        "(rows x sequence) and `mask` may hold their attention mask",
    )
    p.add_argument(
        "--budget",
        type=float,
        default=0.01,
        help="largest accuracy drop (classifiers) or output error allowed (default 0.01)",
    )
    p.add_argument("--network", choices=["lan", "wan"], default="lan")
    p.add_argument("--parties", type=int, choices=[2, 3], default=3)
    p.add_argument("--batch", type=int, default=64, help="rows per batch the costs are for")
    p.add_argument("--weights", help="the model's weights (a torch state_dict file)")
    p.add_argument("--out", help="the plan file to write (default: JOBFILE's name + .plan.toml)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Tune, print the report, write the plan."""
    import numpy as np
    import torch

    from mpcml.api import plans
    from mpcml.api.jobfile import model_of
    from mpcml.api.tune import tune
    from mpcml.graph.hf import SequenceModel
    from mpcml.graph.hf import trace as trace_sequence
    from mpcml.graph.init import initial_state, model_initial_state
    from mpcml.graph.ops import GraphError
    from mpcml.graph.tokens import token_rows

    model, weights = model_of(args.jobfile)
    sequence = isinstance(model, SequenceModel)
    module = model.model if sequence else model
    try:
        with np.load(args.calibration) as arrays:
            x = torch.from_numpy(arrays["x"]).float()
            y = torch.from_numpy(arrays["y"]) if "y" in arrays else None
            if sequence and "mask" in arrays:  # token rows as the token owner shares them
                rows = token_rows(arrays["x"], arrays["mask"], int(module.config.vocab_size))
                x = torch.from_numpy(rows)
    except (OSError, KeyError, ValueError, GraphError) as exc:
        print(
            f"error: --calibration {args.calibration}: rows `x` unreadable: {exc}", file=sys.stderr
        )
        return EXIT_BAD_INPUT
    if args.weights:
        module.load_state_dict(torch.load(args.weights, weights_only=True))
    elif "init_seed" in weights or not weights:
        seed = int(weights.get("init_seed", 0))
        if sequence:  # the graph's parameters, keyed as the model's; its buffers stay
            state = initial_state(trace_sequence(model), seed)
            unexpected = module.load_state_dict(state, strict=False).unexpected_keys
            assert not unexpected, f"graph parameters the model lacks: {unexpected}"
        else:
            module.load_state_dict(model_initial_state(model, tuple(x.shape[1:]), seed))
    else:
        print(
            "error: the job's weights are a private or trained model: give them with --weights",
            file=sys.stderr,
        )
        return EXIT_BAD_INPUT
    tuned = tune(
        model,
        x,
        y,
        budget=args.budget,
        network=args.network,
        parties=args.parties,
        batch=args.batch,
    )
    print(tuned.report())
    out = Path(args.out or Path(args.jobfile).with_suffix(".plan.toml"))
    command = " ".join(["mpcml", "tune", *sys.argv[2:]]) if sys.argv[1:2] == ["tune"] else ""
    plans.write(tuned.plan, out, command or "mpcml tune")
    print(f"wrote {out}")
    return EXIT_OK
