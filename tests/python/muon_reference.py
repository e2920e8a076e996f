"""torch.optim.Muon (and AdamW for the other roles) on fixed weights and gradients: the golden
values loom's Muon is checked against (tests/unit/test_optim.cpp).

Writes OUT (safetensors): the initial weights ("init.<name>"), the gradients of each step
("grad.<step>.<name>"), and each case's weights after STEPS steps ("after.<case>.<name>").
Cases: "original" (Nesterov) and "match_rms_adamw" (plain momentum). Groups as loom makes them:
2-D hidden matrices to Muon (lr, weight_decay), the embedding to AdamW with lr x 0.5, the norm
to AdamW with weight decay x 0.
"""
import sys

import torch
from safetensors.torch import save_file

STEPS = 10
LR, WD, MOMENTUM = 0.02, 0.1, 0.95
BETAS, EPS = (0.9, 0.95), 1e-8
EMBEDDING_LR_FACTOR, SCALAR_WD_FACTOR = 0.5, 0.0
SHAPES = {
    "layers.0.attention.wq.weight": (32, 16),  # tall
    "layers.0.attention.wo.weight": (24, 24),  # square
    "layers.0.feed_forward.w2.weight": (16, 48),  # wide
    "tok_embeddings.weight": (50, 16),
    "norm.weight": (16,),
}
CASES = {"original": True, "match_rms_adamw": False}  # rule -> nesterov


def run(init, grads, rule, nesterov):
    params = {n: t.clone().requires_grad_(True) for n, t in init.items()}
    matrices = [p for n, p in params.items() if p.ndim == 2 and not n.startswith("tok_")]
    muon = torch.optim.Muon(matrices, lr=LR, weight_decay=WD, momentum=MOMENTUM,
                            nesterov=nesterov, adjust_lr_fn=rule)
    adamw = torch.optim.AdamW(
        [{"params": [params["tok_embeddings.weight"]], "lr": LR * EMBEDDING_LR_FACTOR},
         {"params": [params["norm.weight"]], "weight_decay": WD * SCALAR_WD_FACTOR}],
        lr=LR, betas=BETAS, eps=EPS, weight_decay=WD, fused=True)
    for step in range(STEPS):
        for n, p in params.items():
            p.grad = grads[step][n].clone()
        muon.step()
        adamw.step()
    return {n: p.detach() for n, p in params.items()}


def main():
    torch.manual_seed(51)
    init = {n: torch.randn(s) * 0.1 for n, s in SHAPES.items()}
    grads = [{n: torch.randn(s) * 0.01 for n, s in SHAPES.items()} for _ in range(STEPS)]
    out = {f"init.{n}": t for n, t in init.items()}
    for step, g in enumerate(grads):
        out.update({f"grad.{step}.{n}": t for n, t in g.items()})
    for rule, nesterov in CASES.items():
        out.update({f"after.{rule}.{n}": t for n, t in run(init, grads, rule, nesterov).items()})
    save_file({k: v.contiguous() for k, v in out.items()}, sys.argv[1])


if __name__ == "__main__":
    main()
