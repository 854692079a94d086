"""Step time of CE + ACL with ACL-Grad vs. CE alone: same model, same batch, stage 1 and stage 2 of 2ST.

    python bench/finetune/acl_overhead.py [--model DIR] [--task RTE] [--batch 16] [--seq 64] [--steps 4] [--rounds 3]

Stage 1 trains backbone + last exit (a full backward either way); stage 2 trains the intermediate exits on a frozen
backbone (no backbone graph), with KD from the last exit in both the baseline and the ACL cases. For each angle scope
(exit parameters, exit representation, all trainable parameters) ACL-Grad measures the CE/contrastive angle every
step and gates the contrastive term. Target: ≤ 1.15× in stage 2. Harness and timing as in
bench/finetune/finetune_step.py (interleaved cases, median step time).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: bench.harness and the packages

from bench.finetune.finetune_step import build_case, parse_args, real_batch, report, run_interleaved  # noqa: E402

SCOPES = ("exit", "representation", "all")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv, __doc__)
    batch = real_batch(args)
    print(
        f"model {args.model} | task {args.task} | batch {args.batch} x seq {batch['input_ids'].shape[1]} | "
        f"{args.rounds} rounds x {args.steps} steps, median"
    )
    common = dict(exits="all", method="2st")
    results = {}
    for stage in (0, 1):
        cases = [build_case("CE", args, stage, **common)]
        cases.append(build_case("CE+ACL (no ACL-Grad)", args, stage, objective="acl", **common))
        for scope in SCOPES:
            cases.append(
                build_case(
                    f"CE+ACL, ACL-Grad scope={scope}",
                    args,
                    stage,
                    objective="acl",
                    acl_grad=True,
                    acl_grad_scope=scope,
                    **common,
                )
            )
        if stage == 1:
            cases.append(
                build_case("CE+ACL-CL, ACL-Grad scope=exit", args, stage, objective="acl-cl", acl_grad=True, **common)
            )
        run_interleaved(cases, batch, args.rounds, args.steps)
        title = (
            "stage 1 (backbone + last exit)"
            if stage == 0
            else "stage 2 (frozen backbone, 5 intermediate exits, KD in every case)"
        ) + ": step time relative to CE alone"
        results[stage] = report(cases, "CE", title)
    gated = [v for k, v in results[1].items() if "ACL-Grad" in k and "scope=exit" in k]
    wall, cpu = max(v[0] for v in gated), max(v[1] for v in gated)
    verdict = "met" if max(wall, cpu) <= 1.15 else "NOT met"
    print(
        f"\nstage 2, CE+ACL(-CL) with ACL-Grad (scope=exit): worst ratio {wall:.2f}x wall, {cpu:.2f}x CPU "
        f"(target <= 1.15x): {verdict}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
