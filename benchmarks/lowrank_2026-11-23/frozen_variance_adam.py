"""Experiment: Adam whose second moment stops moving after a warm-up (as 1-bit Adam does).

Adam divides each coordinate by the running RMS of its gradient, so the update is not
linear in the gradient, and error feedback's promise (what a step leaves out is sent
later) no longer holds for the update. Freezing the second moment once the uncompressed
warm-up ends makes the update linear in the gradient again. Runs ``commpress`` with the
given arguments, every configuration with this optimizer, e.g. ``FREEZE_AFTER=100
python frozen_variance_adam.py train --strategy ddp --steps 400 --compare plain
powersgd:rank=4,start_iter=100``. ``FREEZE_AFTER``: steps before the variance freezes (an
environment variable, so that the worker processes, which re-import this file, see it).
"""

import os
import sys

import torch

import commpress.train.loop as loop
from commpress.cli import main


class FrozenVarianceAdamW(torch.optim.Optimizer):
    def __init__(self, params, lr, freeze_after, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))
        self.freeze_after = freeze_after

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["m"] = torch.zeros_like(p)
                    state["v"] = torch.zeros_like(p)
                state["step"] += 1
                t = state["step"]
                p.mul_(1 - group["lr"] * group["weight_decay"])
                state["m"].lerp_(p.grad, 1 - beta1)
                if t <= self.freeze_after:
                    state["v"].mul_(beta2).addcmul_(p.grad, p.grad, value=1 - beta2)
                v_steps = min(t, self.freeze_after)
                denom = (state["v"] / (1 - beta2**v_steps)).sqrt_().add_(group["eps"])
                p.addcdiv_(state["m"], denom, value=-group["lr"] / (1 - beta1**t))


def _frozen(config, parameters):
    return FrozenVarianceAdamW(parameters, lr=config.lr, freeze_after=FREEZE_AFTER)


FREEZE_AFTER = int(os.environ["FREEZE_AFTER"])
loop.TrainConfig.make_optimizer = _frozen

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
