"""Premise: does a DRAM-write-bound weight gradient (tgmm) overlap a DRAM-read-bound dx matmul
when both run at once on the GPU? torch/cuBLAS stand-ins at gpt-oss d w_gate_up, T = 2048:
  tgmm-like: out[e] = x_e^T @ dh_e  ([128, 2880, 64] x [128, 64, 5760] -> 4.25 GB written)
  dx-like:   dx_e = dh_e @ W_e^T    ([128, 64, 5760] x [128, 5760, 2880] -> 4.25 GB read)
"""
import torch, statistics
torch.manual_seed(0)
E, H, N, R = 128, 2880, 5760, 64
dev = "cuda"
xt = torch.randn(E, H, R, device=dev, dtype=torch.bfloat16)
dh = torch.randn(E, R, N, device=dev, dtype=torch.bfloat16)
W = torch.randn(E, H, N, device=dev, dtype=torch.bfloat16)
out = torch.empty(E, H, N, device=dev, dtype=torch.bfloat16)
dx = torch.empty(E, R, H, device=dev, dtype=torch.bfloat16)
s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
def tg(): torch.bmm(xt, dh, out=out)
def dxf(): torch.bmm(dh, W.transpose(1, 2), out=dx)
def timeit(fn, reps=20):
    for _ in range(3): fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); fn(); b.record(); torch.cuda.synchronize(); ts.append(a.elapsed_time(b))
    return statistics.median(ts)
def both_streams():
    cur = torch.cuda.current_stream()
    s1.wait_stream(cur); s2.wait_stream(cur)
    with torch.cuda.stream(s1): tg()
    with torch.cuda.stream(s2): dxf()
    cur.wait_stream(s1); cur.wait_stream(s2)
def sequential(): tg(); dxf()
t_tg, t_dx = timeit(tg), timeit(dxf)
t_seq, t_par = timeit(sequential), timeit(both_streams)
print(f"tgmm-like {t_tg:.3f} ms ({E*H*N*2/t_tg/1e9:.2f} TB/s)  dx-like {t_dx:.3f} ms ({E*H*N*2/t_dx/1e9:.2f} TB/s)")
print(f"sequential {t_seq:.3f} ms   two streams {t_par:.3f} ms   ({2*E*H*N*2/t_par/1e9:.2f} TB/s of W read + dW written)")
