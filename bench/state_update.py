"""A decode step's recurrent-state update, in place in the pool vs on a gathered copy written
back, side by side in one run: the recurrent mixers of one layer of each kind (Mamba2: bamba;
gated DeltaNet: qwen3_next) at bench size (``bench.vs_transformers``' configs), 16 and 64 rows,
their states in a pool of twice as many slots in random order.

For each mixer and batch size, the CPU time of one ``decode`` call with the rows' ``StateRows``
(the engine's path) and without (the state gathered with ``index_select``, updated, scattered
back with ``index_copy_``), best of ``--rounds`` rounds of ``--calls`` calls, alternating the
two. Both change the same slots the same way (``tests/models/test_state_in_place.py``).

Then the conv step alone (``replica.model.conv.conv_step``, the window time-major) against the
same step computed along the window (the state's innermost dimension, the way it was written
before), on each mixer's conv state: CPU time per call, and the bench checks that both give the
same output and state bit for bit.

On CUDA (``--device cuda``) the update is the fused kernels' (mamba-ssm's state update,
flash-linear-attention's recurrent step), in place in the pool by slot, against the same kernels
on a gathered copy written back (how a decode step ran them before): wall time per call with the
device synchronised, best of the rounds; the conv table is the CPU's alone.

Run: ``python -m bench.state_update [--quick] [--device cuda]``.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
import transformers

from bench.harness.bench_models import configs
from bench.harness.report import Table
from replica.model import LayerBuffers, kernels, load_model
from replica.model.conv import conv_step
from replica.model.state_rows import StateRows

FAMILIES = {"bamba": "Mamba2", "qwen3_next": "gated DeltaNet"}
BATCHES = (16, 64)


def recurrent_mixer(family: str):
    """The first recurrent mixer of ``family``'s bench-size model, with its config."""
    torch.manual_seed(0)
    hf = transformers.AutoModelForCausalLM.from_config(configs(256)[family]())
    with tempfile.TemporaryDirectory() as path:
        hf.save_pretrained(path)
        cfg, model, _ = load_model(path)
    layer = next(la for la in model.layers if la.mamba is not None or la.deltanet is not None)
    return cfg, layer.mamba if layer.mamba is not None else layer.deltanet


def seconds_per_call(
    mixer, batch: int, cfg, calls: int, rounds: int, device: torch.device
) -> tuple[float, float]:
    """(in place, on a copy): seconds of one decode call, best of ``rounds``."""
    gen = torch.Generator().manual_seed(batch)
    buffers = LayerBuffers.allocate(cfg, mamba_slots=2 * batch, kv_token_slots=1, device=device)
    for t in (buffers.conv[0], buffers.ssm[0]):
        t.copy_(torch.randn(t.shape, generator=gen) * 0.1)
    order = torch.randperm(2 * batch, generator=gen)[:batch].to(device)
    h = torch.randn(batch, cfg.hidden_size, generator=gen).to(device)
    conv, ssm = buffers.conv[0], buffers.ssm[0]
    if device.type == "cuda":  # the kernels in place, and on a gathered copy written back
        variants = kernel_variants(mixer, h, conv, ssm, order)
    else:  # the rows' views (``StateRows``), and the PyTorch path's own copy
        rows = StateRows.build(buffers.ssm[:1], order.tolist())
        variants = {
            in_place: lambda view=(rows.ssm[0] if in_place else None): mixer.decode(
                h, conv, ssm, order, view
            )
            for in_place in (True, False)
        }
    best = best_alternating(variants, calls, rounds, cuda=device.type == "cuda")
    return best[True], best[False]


def kernel_variants(mixer, h, conv, ssm, order) -> dict[bool, Callable[[], torch.Tensor]]:
    """The decode call with the state updated in place by slot (True), and on a gathered copy
    written back (False: the batch's conv and SSM state copied out, stepped, copied back, as a
    decode step ran the kernels before; the conv state is a small part of it). Both change the
    same slots the same way (tests/test_bench_state_update.py)."""
    everyone = torch.arange(h.shape[0], device=h.device)

    def on_a_copy() -> torch.Tensor:
        conv_rows, ssm_rows = conv.index_select(0, order), ssm.index_select(0, order)
        out = mixer.decode(h, conv_rows, ssm_rows, everyone)
        conv.index_copy_(0, order, conv_rows)
        ssm.index_copy_(0, order, ssm_rows)
        return out

    return {True: lambda: mixer.decode(h, conv, ssm, order), False: on_a_copy}


def best_alternating(variants: dict, calls: int, rounds: int, cuda: bool = False) -> dict:
    """Seconds of one call of each of ``variants`` (key -> callable), best of ``rounds`` rounds
    of ``calls`` calls, the variants alternating within each round (round 0 warms up): CPU time,
    or on CUDA wall time with the device synchronised before and after."""
    clock = time.perf_counter if cuda else time.process_time
    best = {key: float("inf") for key in variants}
    with torch.inference_mode():
        for round_ in range(rounds + 1):
            for key, call in variants.items():
                if cuda:
                    torch.cuda.synchronize()
                start = clock()
                for _ in range(calls):
                    call()
                if cuda:
                    torch.cuda.synchronize()
                if round_:
                    best[key] = min(best[key], (clock() - start) / calls)
    return best


def conv_step_along_the_window(x, conv_buf, slots, weight, bias):
    """``conv_step`` with the cat, shift and sum along the window (k steps, innermost)."""
    state = conv_buf.index_select(0, slots)
    window = torch.cat([state.to(x.dtype), x[:, :, None]], dim=-1)  # [B, C, k]
    conv_buf.index_copy_(0, slots, window[:, :, 1:].to(conv_buf.dtype).contiguous())
    out = (window.to(weight.dtype) * weight[:, 0]).sum(-1)
    if bias is not None:
        out = out + bias
    return F.silu(out).to(x.dtype)


def conv_seconds(mixer, batch: int, calls: int, rounds: int) -> tuple[float, float]:
    """(ours, along the window): CPU seconds of one conv step of ``batch`` rows, best of
    ``rounds``; raises if the two differ in a bit of output or state."""
    gen = torch.Generator().manual_seed(batch)
    weight, bias = mixer.conv1d.weight.detach(), mixer.conv1d.bias
    bias = None if bias is None else bias.detach()
    channels, _, k = weight.shape
    conv_buf = torch.randn(2 * batch, channels, k - 1, generator=gen)
    slots = torch.randperm(2 * batch, generator=gen)[:batch]
    x = torch.randn(batch, channels, generator=gen)
    steps = {"ours": conv_step, "window": conv_step_along_the_window}
    results = {name: (step(x, buf := conv_buf.clone(), slots, weight, bias), buf)
               for name, step in steps.items()}  # fmt: skip
    for a, b in zip(results["ours"], results["window"]):
        assert torch.equal(a, b), "the two conv steps differ"
    best = best_alternating(
        {name: lambda step=step: step(x, conv_buf, slots, weight, bias)
         for name, step in steps.items()},
        calls,
        rounds,
    )  # fmt: skip
    return best["ours"], best["window"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer calls and rounds")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    args = parser.parse_args()
    rounds, calls = (2, 10) if args.quick else (args.rounds, args.calls)
    device = torch.device(args.device)
    torch.set_num_threads(1)
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    if device.type == "cuda":
        probe = torch.zeros(1, device=device)
        print(
            f"one recurrent layer's decode call on {torch.cuda.get_device_name(device)}, wall "
            f"time; best of {rounds} x {calls}; kernels: mamba-ssm "
            f"{kernels.mamba_ssm(probe)}, flash-linear-attention's step {kernels.fla_step(probe)}"
        )
    else:
        print(f"one recurrent layer's decode call, CPU, 1 torch thread; best of {rounds} x {calls}")
    table = Table("mixer", "rows", "in place us", "on a copy us", "copy / in place")
    for family, kind in FAMILIES.items():
        cfg, mixer = recurrent_mixer(family)
        mixer.to(device)
        for batch in BATCHES:
            in_place, copied = seconds_per_call(mixer, batch, cfg, calls, rounds, device)
            table.add(kind, batch, f"{in_place * 1e6:.0f}", f"{copied * 1e6:.0f}",
                      f"{copied / in_place:.2f}")  # fmt: skip
    table.print()
    if device.type == "cuda":
        return
    print("\nthe conv step alone: the window time-major (ours) vs along the window; bit-identical")
    table = Table("mixer", "channels", "rows", "ours us", "along the window us", "window / ours")
    for family, kind in FAMILIES.items():
        _, mixer = recurrent_mixer(family)
        for batch in BATCHES:
            ours, window = conv_seconds(mixer, batch, 10 * calls, rounds)
            table.add(kind, mixer.conv1d.weight.shape[0], batch, f"{ours * 1e6:.0f}",
                      f"{window * 1e6:.0f}", f"{window / ours:.2f}")  # fmt: skip
    table.print()


if __name__ == "__main__":
    main()
