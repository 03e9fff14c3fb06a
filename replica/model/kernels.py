"""Fused CUDA kernels for the recurrent mixers, used when installed (the ``cuda-kernels`` extra).

mamba-ssm (SSD chunk scan, selective state update), causal-conv1d and flash-linear-attention
(gated delta rule: chunk kernel, recurrent step). Each ``<package>(t)`` test says whether its
kernels serve tensor ``t``: on CUDA, package importable, and kernels not switched off with
:func:`disabled` (how the GPU tests run the PyTorch reference path on the same device). The
decode steps update the pool's state in place by slot. The PyTorch code in the mixers is the
reference these kernels are tested against (tests/gpu/ on a GPU; on the CPU, the Triton kernels
under Triton's interpreter, with :func:`interpreted`).
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator
from functools import cache

import torch

_enabled = True
_interpreted = False


@contextlib.contextmanager
def disabled() -> Iterator[None]:
    """Run the PyTorch path even where kernels are installed."""
    global _enabled
    before, _enabled = _enabled, False
    try:
        yield
    finally:
        _enabled = before


@contextlib.contextmanager
def interpreted() -> Iterator[None]:
    """Let the Triton kernels (mamba-ssm's, flash-linear-attention's recurrent step) serve CPU
    tensors too: for a process that runs Triton's kernels in its interpreter
    (``TRITON_INTERPRET=1`` before they are imported), as the CPU tests do.
    flash-linear-attention's chunk kernel does not run there, and causal-conv1d is CUDA code."""
    global _interpreted
    before, _interpreted = _interpreted, True
    try:
        yield
    finally:
        _interpreted = before


@cache
def _module(name: str):
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def forget_modules() -> None:
    """Import the kernels' packages again on next use (for a process that took them off
    ``sys.path``, as the interpreter tests do)."""
    _module.cache_clear()


def _serves(t: torch.Tensor, module: str, triton: bool = False) -> bool:
    """``triton``: the package's kernels are Triton's, which the interpreter runs on the CPU."""
    on_device = t.is_cuda or (triton and _interpreted)
    return _enabled and on_device and _module(module) is not None


def causal_conv1d(t: torch.Tensor) -> bool:
    return _serves(t, "causal_conv1d")


def mamba_ssm(t: torch.Tensor) -> bool:
    return _serves(t, "mamba_ssm.ops.triton.ssd_combined", triton=True)


def fla(t: torch.Tensor) -> bool:
    """flash-linear-attention's chunk kernel (prefill) takes half precision only (float32 models
    run the PyTorch path)."""
    return t.dtype in (torch.float16, torch.bfloat16) and _serves(t, "fla.ops.gated_delta_rule")


def fla_step(t: torch.Tensor) -> bool:
    """flash-linear-attention's recurrent step (decode), any precision; its kernel runs in
    Triton's interpreter too."""
    return _serves(t, "fla.ops.kda.fused_recurrent", triton=True)


def causal_conv1d_fn(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """``silu(causal conv)`` of ``x [B, C, L]`` (zero history), ``weight [C, k]``."""
    return _module("causal_conv1d").causal_conv1d_fn(
        x.contiguous(), weight, bias, activation="silu"
    )


def causal_conv1d_update(
    x: torch.Tensor, state: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """One step ``x [B, C]`` with ``state [B, C, k-1]`` (updated in place)."""
    return _module("causal_conv1d").causal_conv1d_update(x, state, weight, bias, activation="silu")


def mamba_chunk_scan(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    chunk_size: int,
    initial_state: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`replica.model.ssd.ssd_chunk_scan` by mamba-ssm (``dt`` already final, no ``D``)."""
    scan = _module("mamba_ssm.ops.triton.ssd_combined").mamba_chunk_scan_combined
    y, final = scan(
        x.contiguous(),
        dt.contiguous(),
        A,
        B.contiguous(),
        C.contiguous(),
        chunk_size,
        initial_states=initial_state.contiguous(),
        return_final_states=True,
    )
    return y.float(), final.float()


def selective_state_update(
    state: torch.Tensor,
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor,
    slots: torch.Tensor,
) -> torch.Tensor:
    """One Mamba2 step per row on the pool's state ``[slots, h, p, n]``, updated in place at row
    ``b``'s slot ``slots[b]``; ``y = S C + D x``.

    ``x [B, h, p]``, ``dt [B, h]`` (final), ``A [h]``, ``B``/``C [B, g, n]``, ``D [h]``. ``D`` and
    a zero ``dt_bias`` are always passed: with ``A`` and ``dt`` broadcast over the head
    dimension, mamba-ssm's launcher reads both unconditionally (2.2 to 2.3.2 fail without them).

    The rows run in parallel, each reading its slot and writing it back, so slots must be
    distinct, but for rows whose ``dt`` is 0 (a padded batch's rows on the scratch slot): their
    step is ``S * exp(0) + 0``, which writes back exactly what it read, so they may share a slot
    in any order and all agree.
    """
    update = _module("mamba_ssm.ops.triton.selective_state_update").selective_state_update
    p, n = x.shape[-1], state.shape[-1]
    return update(
        state,
        x,
        dt[..., None].expand(-1, -1, p),
        A[:, None, None].expand(-1, p, n),
        B,
        C,
        D=D[:, None].expand(-1, p),
        dt_bias=dt.new_zeros(1).expand(dt.shape[1], p),
        state_batch_indices=slots,
    )


def chunk_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor,
    dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`replica.model.delta_rule.chunk_gated_delta_rule` by flash-linear-attention, with
    ``q``/``k``/``v`` in the half-precision ``dtype`` (``g``, ``beta`` and the states float32)."""
    rule = _module("fla.ops.gated_delta_rule").chunk_gated_delta_rule
    out, final = rule(
        q.to(dtype),
        k.to(dtype),
        v.to(dtype),
        g,
        beta,
        scale=1.0,
        initial_state=initial_state.contiguous(),
        output_final_state=True,
    )
    return out.float(), final.float()


def gated_delta_step(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    slots: torch.Tensor,
) -> torch.Tensor:
    """:func:`replica.model.delta_rule.gated_delta_step` by flash-linear-attention, on the pool's
    state ``[slots, h, dk, dv]`` updated in place at row ``b``'s slot ``slots[b]``; returns
    ``o [B, h, dv]`` (float32).

    Its gated delta rule takes no slot indices, so this is its KDA step (Kimi Delta Attention),
    whose gate is per key channel and which takes them (``ssm_state_indices``, the final state
    written where it was read): with the head's gate on every key channel it is the gated
    delta step. Slots must be distinct but for rows whose ``beta`` and ``g`` are 0, which
    write back exactly what they read (as :func:`selective_state_update`).
    """
    step = _module("fla.ops.kda.fused_recurrent").fused_recurrent_kda_fwd
    dk = k.shape[-1]
    out, _ = step(
        q[:, None].contiguous(),
        k[:, None].contiguous(),
        v[:, None].contiguous(),
        g[:, None, :, None].expand(-1, -1, -1, dk).contiguous(),
        beta[:, None].contiguous(),
        initial_state=state,
        scale=1.0,
        inplace_final_state=True,
        ssm_state_indices=slots,
    )
    return out[:, 0].float()
