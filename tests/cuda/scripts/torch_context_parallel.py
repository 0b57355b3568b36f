"""torchrun, 2 GPUs: torch's context_parallel ring (flash attention, bf16) on the head-tail
(zig-zag) slices that ember's SequenceSplit cuts, against one-GPU SDPA; prints MAX_DIFF lines."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.experimental import context_parallel

from ember.parallel.ring import SequenceSplit

dist.init_process_group("nccl")
rank = dist.get_rank()
torch.cuda.set_device(rank)
mesh = init_device_mesh("cuda", (2,))
torch.manual_seed(0)
q, k, v, grad = (torch.randn(2, 4, 256, 64, device="cuda", dtype=torch.bfloat16) for _ in range(4))
full = [t.clone().requires_grad_() for t in (q, k, v)]
F.scaled_dot_product_attention(*full, is_causal=True).backward(grad)
split = SequenceSplit(2, rank)
mine = [t.clone() for t in (q, k, v, grad)]
with context_parallel(mesh, buffers=mine, buffer_seq_dims=[2, 2, 2, 2], no_restore_buffers=set(mine)):
    # torch's head-tail load balancer must cut the zig-zag slices ember's loaders cut
    assert torch.equal(mine[0], split.shard(q, 2)), "torch's load balancer cut other slices than ember's"
    local = [t.requires_grad_() for t in mine[:3]]
    out = F.scaled_dot_product_attention(*local, is_causal=True)
    out.backward(mine[3])
ref = F.scaled_dot_product_attention(q, k, v, is_causal=True)
print("MAX_DIFF out", (out - split.shard(ref, 2)).abs().max().item())
for name, m, f in zip("qkv", local, full, strict=True):
    print(f"MAX_DIFF d{name}", (m.grad - split.shard(f.grad, 2)).abs().max().item())
dist.destroy_process_group()
