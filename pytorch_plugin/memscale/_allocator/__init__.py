"""The allocator glue: installing libmemscale.so as PyTorch's CUDA allocator (install),
its statistics in torch.cuda's names (torch_memory), PyTorch's limits under a pluggable
allocator (torch_limits), snapshots (snapshot) and recording them (record).
"""
