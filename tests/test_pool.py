"""runtime.pool: kernel call lists on machine-code workers (jit.pool_kernel).

Each call of the test kernel adds 1 to its int64, so a lost, doubled or torn call shows
in the counts: lists of different lengths (empty included), workers woken from their
futex sleep, two Python threads running plans at once (separate teams), the kernel
cache cleared under the workers, a forked child, and the parked-Python fallback.
"""
from __future__ import annotations

import os
import threading
import time

import pytest

from runtime import pool, threads
from runtime.threads import usable_cores
from runtime.ffi import ffi
from runtime.kernel import Kernel
from tests.conftest import child_env, in_threads

# mov rax, [rdi]; inc rax; mov [rdi], rax; ret
INC = Kernel("inc", bytes([0x48, 0x8B, 0x07, 0x48, 0xFF, 0xC0, 0x48, 0x89, 0x07, 0xC3]),
             signature="void (*)(void *)")


def _plan(lengths):
    cells = [[ffi.new("int64_t *") for _ in range(n)] for n in lengths]
    return pool.CallPlan([[(INC.function, c) for c in row] for row in cells]), cells


def _counts(cells):
    return [[c[0] for c in row] for row in cells]


@pytest.mark.parametrize("lengths", [[1, 1], [2, 0, 3], [0, 5], [3, 1, 1, 2]])
def test_every_call_once(lengths):
    plan, cells = _plan(lengths)
    for _ in range(2000):
        plan.run()
    assert _counts(cells) == [[2000] * n for n in lengths]


@pytest.mark.parametrize("n", [0, 1, 2, 12])
def test_one_thread_lists_in_one_call(n, monkeypatch):
    """A one-thread list of calls runs in one call of the pool's fork_join where
    prepare_single_runs() found it (here: loaded), else call by call: every call once."""
    pool._load()
    monkeypatch.setattr(pool, "_single_probed", False)
    monkeypatch.setattr(pool, "_single_runner", None)
    plan, cells = _plan([n])
    plan.run()
    pool.prepare_single_runs()
    assert pool._single_runner is not None
    ran = []
    runner = pool._single_runner
    monkeypatch.setattr(pool, "_single_runner", lambda *a: (ran.append(a[2]), runner(*a)))
    for _ in range(100):
        plan.run()
    assert _counts(cells) == [[101] * n]
    assert ran == ([1] * 100 if n > 1 else [])


def test_sleeping_workers_wake():
    """Past their polling the workers sleep in futex; a post must wake them."""
    plan, cells = _plan([1, 1])
    for i in range(5):
        time.sleep(0.01)
        plan.run()
    assert _counts(cells) == [[5], [5]]


def test_two_callers_at_once():
    plans = [_plan([2, 2]) for _ in range(2)]

    def work(plan):
        for _ in range(3000):
            plan.run()
    assert not in_threads(work, [(p,) for p, _ in plans])
    for _, cells in plans:
        assert _counts(cells) == [[3000] * 2] * 2


def test_kernel_cache_clear_leaves_the_workers_alone():
    from jit import cache

    plan, cells = _plan([1, 1])
    plan.run()
    cache.clear_memory()
    plan.run()
    assert _counts(cells) == [[2], [2]]


@pytest.mark.parametrize("spinning", [True, False], ids=["spinning", "parked"])
def test_forked_child_gets_its_own_team(monkeypatch, spinning):
    """A child forked after parallel calls runs them on threads of its own: the
    spinning pool's teams, or (one core, INT8JIT_SPIN_POOL=0) the parked Python workers
    (the child waited forever for its parent's parked workers, which it does not have)."""
    monkeypatch.setattr(pool, "ENABLED", spinning)
    plan, cells = _plan([1, 1])
    plan.run()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through its exit status
        try:
            plan.run()
            os._exit(0 if _counts(cells) == [[2], [2]] else 1)
        finally:
            os._exit(2)
    deadline = time.monotonic() + 60
    while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    if done[0] == 0:  # a failure, not a hung test run
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        pytest.fail("the forked child's parallel call did not return within 60 s")
    assert os.waitstatus_to_exitcode(done[1]) == 0
    assert _counts(cells) == [[1], [1]]  # the child's runs did not touch the parent's memory


def test_parked_python_fallback(monkeypatch):
    monkeypatch.setattr(pool, "ENABLED", False)
    plan, cells = _plan([2, 1])
    for _ in range(50):
        plan.run()
    assert _counts(cells) == [[50, 50], [50]]


def test_exit_while_a_worker_polls():
    """The interpreter exits while a worker still polls its slot (made to poll for
    seconds): the worker's code and slot stay mapped, so the process ends cleanly
    (they were unmapped and freed at exit under it: SIGSEGV)."""
    import subprocess
    import sys
    from pathlib import Path

    script = (
        "import numpy as np\n"
        "import runtime.pool as rp\n"
        "rp.WORKER_SPINS = 10**8\n"
        "from jit.copy_kernel import copy_kernel\n"
        "from runtime.ffi import ffi, pointer_to\n"
        "k = copy_kernel()\n"
        "a = np.ones(64, np.uint8); b = np.zeros(64, np.uint8)\n"
        "s = ffi.new('struct i8j_copy_args *', dict(rows=1, row_bytes=64, src_stride=64, dst_stride=64))\n"
        "s.src, s.dst = pointer_to(a), pointer_to(b)\n"
        "rp.CallPlan([[(k.function, s)], [(k.function, s)]]).run()\n"
        "assert b.all()\n"
    )
    if not pool.ENABLED or usable_cores() < 2:
        pytest.skip("no spinning workers here (INT8JIT_SPIN_POOL=0 or one core)")
    root = Path(__file__).resolve().parent.parent
    proc = subprocess.run([sys.executable, "-c", script], cwd=root, capture_output=True, text=True, timeout=120,
                          env=child_env())
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])


@pytest.mark.parametrize("value, spins", [("", pool.WORKER_SPINS), ("123456", 123456), (" 7 ", 7),
                                          ("0", None), ("-5", None), ("lots", None)])
def test_worker_spins_from_the_environment(monkeypatch, value, spins):
    """INT8JIT_POOL_SPINS sets how long a new team's workers poll before they sleep; a
    value that is not a count of at least 1 is refused, naming the variable (0 would
    make the worker's countdown wrap and poll for ever)."""
    monkeypatch.setenv(pool.SPINS_ENV, value)
    if spins is None:
        with pytest.raises(ValueError, match="INT8JIT_POOL_SPINS"):
            pool.worker_spins()
        return
    assert pool.worker_spins() == spins
    if pool.ENABLED and usable_cores() >= 2 and value:
        team = pool._Team(1)  # a team of its own (the free ones were made before); parks for good
        assert team.slots[0].spins == spins


def test_kept_kernels_stay_mapped():
    """Kernel.keep(): close() leaves the code mapped and callable (the pool's kernels)."""
    from jit.copy_kernel import copy_kernel

    cached = copy_kernel()
    kept = Kernel("kept", cached.code(), signature=cached.signature).keep()
    kept.close()
    assert not kept.closed and kept.function is not None
    plain = Kernel("plain", cached.code(), signature=cached.signature)
    plain.close()
    assert plain.closed


def test_primitives_outlive_a_kernel_cache_clear(isa_path, monkeypatch):
    """jit.cache.clear_memory() forgets kernels; it must not unmap code a primitive's call
    plans still point at (the convolution's row copy is held by its plan alone)."""
    import gc

    import numpy as np

    import primitives.conv
    from jit import cache
    from primitives.conv import ConvolutionDesc

    monkeypatch.setattr(primitives.conv, "edges_pay", lambda *args: False)  # the padded copy, not the edges
    from primitives.memory import Memory, desc
    from primitives.pooling import PoolingDesc
    from primitives.reorder import reorder_desc

    rng = np.random.default_rng(5)
    x = rng.integers(0, 256, (1, 9, 9, 8), dtype=np.uint8)  # NHWC
    w = rng.integers(-128, 128, (8, 8, 3, 3), dtype=np.int8)
    pd = ConvolutionDesc(desc((1, 8, 9, 9), "u8", "nhwc"), desc((8, 8, 3, 3), "s8", "any"),
                         desc((1, 8, 9, 9), "s32", "nhwc"), padding_l=(1, 1), padding_r=(1, 1),
                         isa=isa_path, threads=2)
    packed = Memory(pd.weights_desc())
    reorder_desc(desc(w.shape, "s8", "oihw"), pd.weights_desc()).create().execute({"src": w, "dst": packed})
    conv = pd.create()
    assert pd.impl_info()["source"] == "padded copy in the scratchpad"
    pool = PoolingDesc("max", desc((1, 8, 9, 9), "u8", "nhwc"), desc((1, 8, 4, 4), "u8", "nhwc"),
                       (2, 2), (3, 3), (0, 0), (0, 0), isa=isa_path).create()
    y, z = np.zeros((1, 9, 9, 8), np.int32), np.zeros((1, 4, 4, 8), np.uint8)
    args = {"src": x, "weights": packed, "dst": y}
    conv.execute(args)
    pool.execute({"src": x, "dst": z})
    first_y, first_z = y.copy(), z.copy()
    cache.clear_memory()
    gc.collect()
    y[...], z[...] = 0, 0
    conv.execute(args)  # the replay: the same plan, its row copies included
    pool.execute({"src": x, "dst": z})
    assert (y == first_y).all() and (z == first_z).all()


def test_teams_are_reused_across_runs_and_plans():
    if not pool.ENABLED or usable_cores() < 2:
        pytest.skip("no spinning workers here (INT8JIT_SPIN_POOL=0 or one core)")
    _plan([1, 1])[0].run()
    before = threading.active_count()
    for _ in range(3):
        plan, cells = _plan([1, 1])
        for _ in range(200):
            plan.run()
        assert _counts(cells) == [[200], [200]]
    assert threading.active_count() == before  # no new worker per plan or call


def test_core_count_is_looked_up_at_most_once_a_second(monkeypatch):
    calls = []

    def affinity(pid):
        calls.append(pid)
        return {0, 1}

    monkeypatch.setattr(threads.os, "sched_getaffinity", affinity)
    monkeypatch.setattr(threads, "_cores_seen", (0, -threads._CORES_TTL_S))
    assert [usable_cores() for _ in range(100)] == [2] * 100
    assert len(calls) == 1
    count, when = threads._cores_seen
    monkeypatch.setattr(threads, "_cores_seen", (count, when - threads._CORES_TTL_S))  # a second later
    usable_cores()
    assert len(calls) == 2


def test_a_job_no_worker_takes_runs_on_the_caller():
    """A worker whose vCPU the host has descheduled never picks its job up: the caller,
    its own list done, claims the job and runs it (a slot without any worker thread here;
    before the claim protocol the call waited for that worker forever)."""
    fork_join = pool._load()[1].function
    slot = ffi.new("struct i8j_slot *")
    slots = ffi.new("struct i8j_slot *[]", [slot])
    cells = [[ffi.new("int64_t *") for _ in range(n)] for n in (2, 3)]
    jobs = ffi.new("struct i8j_job[]", 2)
    arrays = []
    for job, row in zip(jobs, cells):
        array = ffi.new("struct i8j_call[]", len(row))
        for entry, cell in zip(array, row):
            entry.fn = ffi.cast("void (*)(void *)", INC.function)
            entry.arg = cell
        arrays.append(array)
        job.calls, job.ncalls = array, len(row)
    done = threading.Event()

    def call():
        for _ in range(3):
            fork_join(slots, jobs, 2, pool.JOIN_SPINS)
        done.set()

    threading.Thread(target=call, daemon=True).start()
    assert done.wait(30), "the call waited for a worker that does not exist"
    assert _counts(cells) == [[3, 3], [3, 3, 3]]
    assert slot.claimed == 3 and slot.state == pool.pk.DONE


def test_the_caller_claims_only_untaken_jobs():
    """With real workers, every call still runs each list once, whoever claims it."""
    if not pool.ENABLED or usable_cores() < 2:
        pytest.skip("no spinning workers here (INT8JIT_SPIN_POOL=0 or one core)")
    plan, cells = _plan([0, 4])  # the caller's own list is empty: it races the worker for the job
    plan.run()
    teams = plan._teams

    def claimed():
        return sum(team.slots[0].claimed for team in teams)

    before = claimed()
    for _ in range(3000):
        plan.run()
    assert _counts(cells) == [[], [3001] * 4]
    assert 0 <= claimed() - before <= 3000
