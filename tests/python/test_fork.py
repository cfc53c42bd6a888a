"""A loss in a forked child finishes (README, "A forked child runs serially").

libgomp's thread pool does not survive fork(): in the child of a process that ran OpenMP work (a
kdloss call, or only a torch matmul on the same runtime) a parallel region with more than one
thread waited forever. kdloss's pthread_atfork child handler makes the child serial. Each case
forks with multiprocessing's 'fork' start method (and os.fork), runs the loss in the child, and
waits at most TIMEOUT seconds; the child's loss must equal the parent's (the fused loss is
thread-count independent, so the serial child gives the same bits).
"""

import multiprocessing as mp
import os
import signal
import time

import pytest
import torch

from kdloss.torch import fused_linear_jsd, kl_div

from conftest import require

pytestmark = [require("kdloss_fused_linear_jsd"),
              pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")]

TIMEOUT = 30.0


def _inputs():
    g = torch.Generator().manual_seed(1234)
    xs = torch.randn(64, 48, generator=g)
    ws = torch.randn(1024, 48, generator=g) * 0.2
    xt = torch.randn(64, 32, generator=g)
    wt = torch.randn(1024, 32, generator=g) * 0.2
    labels = torch.randint(0, 1024, (64,), generator=g)
    y = torch.log_softmax(torch.randn(128, 2048, generator=g), -1)
    t = torch.softmax(torch.randn(128, 2048, generator=g), -1)
    return xs, ws, xt, wt, labels, y, t


def _losses():
    xs, ws, xt, wt, labels, y, t = _inputs()
    a = fused_linear_jsd(xs, ws, xt, wt, labels)
    b = kl_div(y, t, reduction="sum")
    return [float(a), float(b)]


def _child(q):
    signal.alarm(int(2 * TIMEOUT))  # never outlive the test
    q.put(_losses())


def _run_forked(warm):
    torch.set_num_threads(2)  # a pool with a worker, even on one core
    warm()
    want = _losses()
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=_child, args=(q,))
    p.start()
    p.join(TIMEOUT)
    if p.is_alive():
        p.kill()
        p.join()
        pytest.fail(f"the forked child hung (killed after {TIMEOUT} s)")
    assert p.exitcode == 0
    assert q.get(timeout=5) == want


def test_fork_after_kdloss_call():
    _run_forked(_losses)


def test_fork_after_torch_matmul_only():
    _run_forked(lambda: torch.randn(512, 512) @ torch.randn(512, 512))


def test_os_fork_child_of_child():
    torch.set_num_threads(2)
    want = _losses()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child forks again; the grandchild computes
        try:
            signal.alarm(int(2 * TIMEOUT))  # never outlive the test
            os.close(r)
            gpid = os.fork()
            if gpid == 0:
                signal.alarm(int(2 * TIMEOUT))
                ok = _losses() == want
                os._exit(0 if ok else 2)
            _, st = os.waitpid(gpid, 0)
            os.write(w, b"1" if os.waitstatus_to_exitcode(st) == 0 else b"0")
        finally:
            os._exit(0)
    os.close(w)
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        done, st = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.05)
    else:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        pytest.fail(f"the forked children hung (killed after {TIMEOUT} s)")
    assert os.read(r, 1) == b"1"
    os.close(r)
