"""Leaving the process group: nothing the sharded model held outlives it into the interpreter's
teardown (where a gloo rank can abort), in a fresh process with a one-rank gloo group."""

from __future__ import annotations

import json
import subprocess
import sys

SCRIPT = r"""
import gc, json, weakref
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from advisor.trainer.dist import shutdown_distributed

dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
mesh = init_device_mesh("cpu", (1,))
model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 1))
for layer in model:
    fully_shard(layer, mesh=mesh)
fully_shard(model, mesh=mesh)
model(torch.ones(2, 4)).sum().backward()
alive = weakref.ref(model)
del model, mesh, layer
gc.disable()  # as if no collection happened to run between the last step and the exit
before = alive() is not None
shutdown_distributed()
print(json.dumps({"held_by_cycles": before, "after": alive() is not None,
                  "initialized": dist.is_initialized()}))
"""


def test_the_sharded_model_is_freed_before_the_group_is_destroyed() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300, check=True
    )
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["held_by_cycles"], "the model no longer outlives its references: test is moot"
    assert not result["after"]
    assert not result["initialized"]
