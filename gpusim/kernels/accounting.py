"""The per-slot episode accumulators of one step (stage ``accounting``), and the contacts of agents
in play.

For slots ``[W, C]`` and agents ``[W, A]``: ``ep_return + reward``, ``ep_length + loss_mask``,
``goal_reached | goal_now``, ``ever_collided | (in_play & collided)``,
``ever_offroad | (in_play & offroad)``, ``ever_red_light | red_light_now``; plus
``in_play & collided``, ``in_play & offroad`` and the number of ``terminal`` slots.

Backends (``backend=`` of :func:`accumulate`): the torch expressions (CUDA tensors run them too:
elementwise, no kernel of their own) and the C kernel of ``accounting.c`` (one pass, equal bit for
bit, the terminal count returned by the C call: no tensor read).
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from gpusim.backend import WITH_C, op_backend
from gpusim.kernels.cbuild import STEP_LABEL, CLibrary, CStruct, c_tensor, declare_struct_entry

_NAMES = ("ep_return", "reward", "ep_length", "loss_mask", "goal_reached", "goal_now", "in_play", "collided",
          "offroad", "ever_collided", "ever_offroad", "ever_red_light", "red_light_now", "terminal")


def accumulate_reference(ep_return, reward, ep_length, loss_mask, goal_reached, goal_now, in_play, collided, offroad,
                         ever_collided, ever_offroad, ever_red_light, red_light_now, terminal, count: bool = True):
    """The torch expressions of :func:`accumulate` (same arguments and result); the terminal count
    is read from the tensor where ``count`` and it is on the CPU (no sync there), else None."""
    col_ip, off_ip = in_play & collided, in_play & offroad
    changes = {"ep_return": ep_return + reward, "ep_length": ep_length + loss_mask,  # int32 + bool -> int32
               "goal_reached": goal_reached | goal_now, "ever_collided": ever_collided | col_ip,
               "ever_offroad": ever_offroad | off_ip, "ever_red_light": ever_red_light | red_light_now}
    return changes, col_ip, off_ip, (int(terminal.sum()) if count and terminal.is_cpu else None)


def accumulate(ep_return, reward, ep_length, loss_mask, goal_reached, goal_now, in_play, collided, offroad,
               ever_collided, ever_offroad, ever_red_light, red_light_now, terminal, *, backend: str | None = None,
               check: bool = True):
    """The accumulator updates of one step (module docstring).

    Args:
        ep_return, reward: [W, C] float32. ep_length: [W, C] int32. loss_mask: [W, C] bool.
        goal_reached, goal_now, in_play, collided, offroad, ever_collided, ever_offroad: [W, A] bool.
        ever_red_light, red_light_now, terminal: [W, C] bool.
        backend: ``"torch"`` | ``"triton"`` / ``"cupy"`` (the torch expressions) | ``"c"``, default
            :func:`gpusim.backend.op_backend`. check: the C kernel's argument checks.

    Returns:
        ``(changes, collided_in_play [W, A] bool, offroad_in_play [W, A] bool, terminals)``;
        ``changes`` maps ``ep_return``, ``ep_length``, ``goal_reached``, ``ever_collided``,
        ``ever_offroad``, ``ever_red_light`` to their new tensors; ``terminals`` is the number of
        terminal slots (host int) on the ``"torch"`` and ``"c"`` backends with CPU tensors, else
        None (no host read: the Triton path stays free of syncs).

    Raises:
        ValueError: (C backend) a tensor of the wrong shape, dtype or device.
    """
    args = (ep_return, reward, ep_length, loss_mask, goal_reached, goal_now, in_play, collided, offroad,
            ever_collided, ever_offroad, ever_red_light, red_light_now, terminal)
    name = op_backend(backend, reward, WITH_C)
    if name == "c":
        return accumulate_cpu(*args, check=check)
    return accumulate_reference(*args, count=name == "torch")


# ---------------------------------------------------------------------------- C kernel (accounting.c)
#: The argument struct of ``gpusim_accounting`` (accounting.c; its C twin is generated from this table).
ACCOUNTING_ARGS = CStruct("AccountingArgs", """
    const float *ep_return, const float *reward, const int32_t *ep_length, const uint8_t *loss_mask,
    const uint8_t *goal_reached, const uint8_t *goal_now, const uint8_t *in_play, const uint8_t *collided,
    const uint8_t *offroad, const uint8_t *ever_collided, const uint8_t *ever_offroad,
    const uint8_t *ever_red_light, const uint8_t *red_light_now, const uint8_t *terminal, float *ep_return_out,
    int32_t *ep_length_out, uint8_t *goal_reached_out, uint8_t *collided_ip, uint8_t *offroad_ip,
    uint8_t *ever_collided_out, uint8_t *ever_offroad_out, uint8_t *ever_red_light_out, int64_t W, int64_t A,
    int64_t C, int num_threads""")


def _declare(lib) -> None:
    """ctypes signature of accounting.c: one :data:`ACCOUNTING_ARGS` struct, the terminal count returned."""
    declare_struct_entry(lib, "gpusim_accounting", ctypes.c_int64)


#: accounting.c, built at first use (:class:`gpusim.kernels.cbuild.CLibrary`).
LIBRARY = CLibrary(name="accounting", source=Path(__file__).with_suffix(".c"), prefix="gpusim_accounting", abi=2,
                   declare=_declare, label=STEP_LABEL, structs=(ACCOUNTING_ARGS,))


def bind_accumulate(backend: str | None, check: bool):
    """:func:`accumulate` with ``backend`` and ``check`` bound: returns ``fn(<its 14 tensors>)``; on
    the C backend without checks it calls the kernel directly."""
    lib = LIBRARY.load(stacklevel=4) if backend == "c" and not check else None
    if lib is None:
        return lambda *tensors: accumulate(*tensors, backend=backend, check=check)
    kernel, e, b = lib.gpusim_accounting, torch.empty, torch.bool

    def run(ep_return, reward, ep_length, loss_mask, goal_reached, goal_now, in_play, collided, offroad,
            ever_collided, ever_offroad, ever_red_light, red_light_now, terminal):
        W, A = in_play.shape
        C = ep_return.shape[1]
        new = {"ep_return": e(W, C), "ep_length": e(W, C, dtype=torch.int32), "goal_reached": e(W, A, dtype=b),
               "ever_collided": e(W, A, dtype=b), "ever_offroad": e(W, A, dtype=b), "ever_red_light": e(W, C, dtype=b)}
        col_ip, off_ip = e(W, A, dtype=b), e(W, A, dtype=b)
        terminals = kernel(ACCOUNTING_ARGS(
            ep_return=ep_return, reward=reward, ep_length=ep_length, loss_mask=loss_mask, goal_reached=goal_reached,
            goal_now=goal_now, in_play=in_play, collided=collided, offroad=offroad, ever_collided=ever_collided,
            ever_offroad=ever_offroad, ever_red_light=ever_red_light, red_light_now=red_light_now,
            terminal=terminal, ep_return_out=new["ep_return"], ep_length_out=new["ep_length"],
            goal_reached_out=new["goal_reached"], collided_ip=col_ip, offroad_ip=off_ip,
            ever_collided_out=new["ever_collided"], ever_offroad_out=new["ever_offroad"],
            ever_red_light_out=new["ever_red_light"], W=W, A=A, C=C, num_threads=torch.get_num_threads()))
        return new, col_ip, off_ip, terminals
    return run


def accumulate_cpu(ep_return, reward, ep_length, loss_mask, goal_reached, goal_now, in_play, collided, offroad,
                   ever_collided, ever_offroad, ever_red_light, red_light_now, terminal, check: bool = True):
    """The C kernel of :func:`accumulate` (same arguments and result, new tensors; the terminal
    count is the C call's return value). ``check=False`` skips the argument checks
    (``StepVars.checked``). Runs :func:`accumulate_reference` where the library cannot be built.

    Raises:
        ValueError: a tensor of the wrong shape, dtype or device.
    """
    W, A = in_play.shape
    C = ep_return.shape[1]
    b = torch.bool
    ins = [ep_return, reward, ep_length, loss_mask, goal_reached, goal_now, in_play, collided, offroad,
           ever_collided, ever_offroad, ever_red_light, red_light_now, terminal]
    if check:
        specs = ((torch.float32, (W, C)), (torch.float32, (W, C)), (torch.int32, (W, C)), (b, (W, C))) + \
            ((b, (W, A)),) * 7 + ((b, (W, C)),) * 3
        ins = [c_tensor(t, "accounting", n, d, sh) for t, n, (d, sh) in zip(ins, _NAMES, specs)]
    lib = LIBRARY.load(stacklevel=4)
    if lib is None:
        return accumulate_reference(*ins)
    return bind_accumulate("c", False)(*ins)
