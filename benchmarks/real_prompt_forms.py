"""Where SmolLM2-135M-Instruct starts: greedy held-out accuracy per prompt form and operand range, side by side.

For each arithmetic prompt form (tasks/prompt_forms.py: bare, fewshot, chat) and each `task.max_operand`,
the preset is scored with the node's own evaluation (its PromptEncoder: the chat template for "chat", plain
text for "fewshot" and "bare") on the same held-out problems of that range, with the answer extraction of
the form. Also printed: the share of answers that ended with <|im_end|> within the token budget, and the
mean completion length, which say how much of a form's loss is the format rather than the arithmetic.
A default configuration should start in the 10-60% band with room to learn.

    python -m benchmarks.real_prompt_forms --json real_prompt_forms.json
    python -m benchmarks.real_prompt_forms --quick
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from swarm_node.generation.hf import TransformersGenerator, completion_text
from swarm_node.generation.prompts import PromptEncoder, chat_template_setting
from swarm_node.generation.stops import stop_token_ids
from swarm_node.models.loading import load_model
from swarm_node.tasks.arithmetic import ArithmeticTask
from tooling.benchmark_args import add_run_args, public_args, resolve_seeds, write_json

FORMS = ("bare", "fewshot", "chat")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_args(ap, seeds=1, quick="n=30, ranges 20 and 99",
                 seeds_help="accepted for the benchmarks' interface: greedy scoring of fixed held-out problems needs no seed")
    ap.add_argument("--ranges", type=int, nargs="+", default=[9, 20, 99], help="task.max_operand values")
    ap.add_argument("--n", type=int, default=200, help="held-out problems per range (fewer if the range has fewer)")
    ap.add_argument("--max-new", type=int, default=8, help="generation.max_new_tokens (the peers' 8)")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    resolve_seeds(args)
    if args.quick:
        args.n, args.ranges = 30, [20, 99]
    torch.set_num_threads(args.threads)
    lm = load_model("smollm2-135m", device="cpu", dtype="float32")
    tok = lm.tokenizer
    gen = TransformersGenerator(lm.model, eos_token_id=stop_token_ids(lm.model, tok), pad_token_id=tok.pad_token_id)
    rows = []
    for hi in args.ranges:
        for form in FORMS:
            task = ArithmeticTask(form=form, max_operand=hi)
            enc = PromptEncoder(tok, chat_template_setting("auto", form))
            prompts = task.eval_prompts("id", args.n)
            t0 = time.perf_counter()
            out = gen.generate([enc.encode(p.text) for p in prompts], 1, max_new_tokens=args.max_new, greedy=True)
            texts = [completion_text(tok, s[0]) for s in out]
            hits = [task.is_correct(p, t) for p, t in zip(prompts, texts, strict=True)]
            plus = [h for h, p in zip(hits, prompts, strict=True) if "+" in p.id]
            rows.append({"max_operand": hi, "form": form, "n": len(prompts), "accuracy": float(np.mean(hits)),
                         "accuracy_plus": float(np.mean(plus)), "accuracy_minus": float(np.mean(
                             [h for h, p in zip(hits, prompts, strict=True) if "+" not in p.id])),
                         "finished": float(np.mean([s[0].finished for s in out])),
                         "completion_tokens": float(np.mean([len(s[0].token_ids) for s in out])),
                         "seconds": round(time.perf_counter() - t0, 1), "examples": texts[:3]})
            r = rows[-1]
            print(f"0..{hi:<3d} {form:8s} n={r['n']:4d} accuracy {r['accuracy']:.3f} (+ {r['accuracy_plus']:.3f}, "
                  f"- {r['accuracy_minus']:.3f}) ended {r['finished']:.2f} tokens {r['completion_tokens']:.1f} "
                  f"[{r['seconds']} s] e.g. {texts[0]!r}", flush=True)
    write_json(args.json, {"args": public_args(args), "rows": rows}, args)


if __name__ == "__main__":
    main()
