"""Machine code for the thread pool: workers that wait, run call lists and hand back
without Python (used by ``runtime.pool``).

A parallel kernel call from Python costs a lock hand-off each way and the GIL for the
worker's few lines of Python (about 16 us for two threads on this project's VM: 7% of a
0.2 ms convolution). Here the worker thread enters :func:`worker_loop` once and stays
in machine code: it polls its slot for a job, runs the job's list of ``fn(arg)``
calls (kernels), marks the slot done, and after a while without work sleeps in the
kernel (``futex``) until woken. The caller's :func:`fork_join` posts a job to each
slot, runs its own list, and waits for every slot: polling first, then ``futex``.

Slot protocol (``state``: IDLE 0, JOB 1, DONE 2, EXIT 3), two Dekker-style flags with
MFENCE between each side's store and load, so a sleeper is always woken:

* caller posts: the job, ``claim = 0``, ``state = JOB``; MFENCE; if ``parked``:
  FUTEX_WAKE(state).
* worker parks: ``parked = 1``; MFENCE; if ``state`` is unchanged: FUTEX_WAIT(state, seen).
* worker sees JOB: XCHG 1 into ``claim`` (a locked exchange); the old 0 makes the job its
  own: it runs the list, then ``state = DONE``; MFENCE; if ``waiting``: FUTEX_WAKE(state).
  An old 1: the caller took the job; back to polling.
* caller, its own list done, first claims each worker's job the same way: a job no
  worker has taken yet it runs itself (``state = DONE``, then the list; ``claimed``
  counts these). On a virtual machine whose host has descheduled a worker's vCPU (a
  spinning vCPU is the first the host takes away), the call then runs at one thread's
  speed instead of waiting milliseconds for the host to bring the vCPU back.
* caller waits for the rest: ``waiting = 1``; MFENCE; if ``state != DONE``:
  FUTEX_WAIT(state, JOB).

Exactly one side exchanges 0 out of ``claim``, so each list runs once. FUTEX_WAIT sleeps
only while the word still holds the value given, so a change that lands between the
check and the sleep returns at once. Stores on x86-64 are seen in order, so the kernels'
results are visible before DONE is, and a worker that sees JOB sees that post's
``claim = 0`` and job.
"""
from __future__ import annotations

CDEF = """
struct i8j_call { void (*fn)(void *); void *arg; };
struct i8j_slot {
    int32_t state; int32_t parked; int32_t waiting; int32_t claim;
    struct i8j_call *calls; int64_t ncalls; int64_t spins;
    int64_t claimed;                      /* jobs the caller ran itself (see the protocol) */
    int64_t pad[3];
};
struct i8j_job { struct i8j_call *calls; int64_t ncalls; };
"""
WORKER_SIGNATURE = "void (*)(struct i8j_slot *)"
FORK_JOIN_SIGNATURE = "void (*)(struct i8j_slot **, struct i8j_job *, int64_t, int64_t)"
IDLE, JOB, DONE, EXIT = 0, 1, 2, 3
# struct offsets (asserted against cffi's in runtime.pool)
STATE, PARKED, WAITING, CLAIM, CALLS, NCALLS, SPINS, CLAIMED = 0, 4, 8, 12, 16, 24, 32, 40
SYS_FUTEX, FUTEX_WAIT_PRIVATE, FUTEX_WAKE_PRIVATE = 202, 128, 129


def _futex(asm, address_reg, op: int, value_reg_or_imm) -> None:
    """futex(address, op, value, NULL): clobbers rax, rdi, rsi, rdx, r10, rcx, r11."""
    from jit.asm import MOV, XOR, rax, rdi, rdx, rsi, r10

    if address_reg is not rdi:
        MOV(rdi, address_reg)
    MOV(rsi.as_dword, op)
    if isinstance(value_reg_or_imm, int):
        MOV(rdx.as_dword, value_reg_or_imm)
    elif value_reg_or_imm is not rdx:
        MOV(rdx.as_dword, value_reg_or_imm)
    XOR(r10.as_dword, r10.as_dword)  # no timeout
    MOV(rax.as_dword, SYS_FUTEX)
    asm.SYSCALL()


def _run_calls(asm, calls, count) -> None:
    """Call ``fn(arg)`` for each of ``count`` entries at ``calls`` (callee-saved registers)."""
    from jit.asm import ADD, CALL, DEC, JZ, LABEL, MOV, TEST, Label, rdi

    loop, done = Label(), Label()
    TEST(count, count)
    JZ(done)
    LABEL(loop)
    MOV(rdi, [calls + 8])
    CALL([calls])
    ADD(calls, 16)
    DEC(count)
    asm.JNZ(loop)
    LABEL(done)


def _emit_worker(argument) -> None:
    from jit import asm
    from jit.asm import CMP, DEC, JE, JMP, LABEL, MOV, Label, r12, r13, r14, rbx, rdi

    slot, calls, count, spins = rbx, r12, r13, r14
    asm.LOAD.ARGUMENT(rdi, argument)
    MOV(slot, rdi)
    _align_stack(asm)
    loop, poll, relax, park, claim, leave = Label(), Label(), Label(), Label(), Label(), Label()
    LABEL(loop)
    MOV(spins, [slot + SPINS])
    LABEL(poll)
    MOV(asm.eax, [slot + STATE])
    CMP(asm.eax, JOB)
    JE(claim)
    CMP(asm.eax, EXIT)
    JE(leave)
    LABEL(relax)
    asm.PAUSE()
    DEC(spins)
    asm.JNZ(poll)
    LABEL(park)  # eax: the state seen last
    MOV(asm.dword[slot + PARKED], 1)
    asm.MFENCE()
    skip = Label()
    CMP(asm.eax, [slot + STATE])
    asm.JNE(skip)
    _futex(asm, slot, FUTEX_WAIT_PRIVATE, asm.eax)
    LABEL(skip)
    MOV(asm.dword[slot + PARKED], 0)
    JMP(loop)
    LABEL(claim)  # the job is the worker's if it exchanges the 0 out of claim
    MOV(asm.ecx, 1)
    asm.XCHG([slot + CLAIM], asm.ecx)
    asm.TEST(asm.ecx, asm.ecx)
    asm.JNZ(relax)  # the caller took it (and is about to set DONE): poll on, politely
    MOV(calls, [slot + CALLS])
    MOV(count, [slot + NCALLS])
    _run_calls(asm, calls, count)
    MOV(asm.dword[slot + STATE], DONE)
    asm.MFENCE()
    CMP(asm.dword[slot + WAITING], 0)
    JE(loop)
    _futex(asm, slot, FUTEX_WAKE_PRIVATE, 2)
    JMP(loop)
    LABEL(leave)
    _restore_stack(asm)
    asm.RETURN()


def _align_stack(asm, frame: int = 16) -> None:
    """rsp down to a multiple of 16 (the ABI's alignment at a CALL) and ``frame`` bytes
    below, the old rsp kept at [rsp] (whatever the prologue pushed), the rest free."""
    from peachpy.x86_64.registers import rsp

    asm.MOV(asm.rax, rsp)
    asm.AND(rsp, -16)
    asm.SUB(rsp, frame)
    asm.MOV([rsp], asm.rax)


def _restore_stack(asm) -> None:
    from peachpy.x86_64.registers import rsp

    asm.MOV(rsp, [rsp])


def _emit_fork_join(arguments) -> None:
    from jit import asm
    from jit.asm import ADD, CMP, DEC, JE, JMP, LABEL, MOV, Label, r12, r13, r14, r15, rbx, rbp, rcx, rdi, rdx, rsi
    from peachpy.x86_64.registers import rsp

    # rdi slots (pointer array), rsi jobs ([0] the caller's, [1..] the slots'), rdx
    # participants (caller included), rcx spins before sleeping while waiting.
    for register, argument in zip((rdi, rsi, rdx, rcx), arguments):
        asm.LOAD.ARGUMENT(register, argument)
    slots, jobs = rbx, r12
    MOV(slots, rdi)
    MOV(jobs, rsi)
    # The participant count and the spins live on the stack: a job the caller claims
    # needs two callee-saved registers (r13, r14) for its list.
    _align_stack(asm, 32)
    n, spins_init = asm.qword[rsp + 16], asm.qword[rsp + 8]
    MOV(n, rdx)
    MOV(spins_init, rcx)

    i, slot = r15, rbp

    def each_worker(body) -> None:
        """``body()`` for i = 1 .. n-1, with ``slot`` = slots[i - 1]."""
        loop, end = Label(), Label()
        MOV(i, 1)
        LABEL(loop)
        CMP(i, n)
        asm.JAE(end)
        MOV(slot, [slots + i * 8 - 8])
        body()
        ADD(i, 1)
        JMP(loop)
        LABEL(end)

    def post() -> None:  # the worker's calls, then JOB; wake it if it sleeps
        MOV(rdx, i)
        asm.SHL(rdx, 4)  # jobs[i]: 16 bytes each
        MOV(asm.rax, [jobs + rdx * 1])
        MOV([slot + CALLS], asm.rax)
        MOV(asm.rax, [jobs + rdx * 1 + 8])
        MOV([slot + NCALLS], asm.rax)
        MOV(asm.dword[slot + CLAIM], 0)
        MOV(asm.dword[slot + STATE], JOB)
        asm.MFENCE()
        awake = Label()
        CMP(asm.dword[slot + PARKED], 0)
        JE(awake)
        _futex(asm, slot, FUTEX_WAKE_PRIVATE, 2)
        LABEL(awake)
    each_worker(post)

    # The caller's own list.
    MOV(r15, [jobs])
    MOV(rbp, [jobs + 8])
    _run_calls(asm, r15, rbp)

    def take() -> None:  # a job no worker has claimed yet: run it here
        taken = Label()
        MOV(asm.eax, 1)
        asm.XCHG([slot + CLAIM], asm.eax)
        asm.TEST(asm.eax, asm.eax)
        asm.JNZ(taken)  # the worker has it
        MOV(asm.dword[slot + STATE], DONE)
        MOV(rdx, i)
        asm.SHL(rdx, 4)
        MOV(r13, [jobs + rdx * 1])
        MOV(r14, [jobs + rdx * 1 + 8])
        _run_calls(asm, r13, r14)
        ADD(asm.qword[slot + CLAIMED], 1)
        LABEL(taken)
    each_worker(take)

    def join() -> None:  # the slot DONE: poll, then sleep
        wait, done, sleep, recheck = Label(), Label(), Label(), Label()
        MOV(rcx, spins_init)
        LABEL(wait)
        CMP(asm.dword[slot + STATE], DONE)
        JE(done)
        asm.PAUSE()
        DEC(rcx)
        asm.JNZ(wait)
        LABEL(sleep)
        MOV(asm.dword[slot + WAITING], 1)
        asm.MFENCE()
        CMP(asm.dword[slot + STATE], DONE)
        JE(recheck)
        _futex(asm, slot, FUTEX_WAIT_PRIVATE, JOB)
        MOV(asm.dword[slot + WAITING], 0)
        JMP(sleep)
        LABEL(recheck)
        MOV(asm.dword[slot + WAITING], 0)
        LABEL(done)
    each_worker(join)
    _restore_stack(asm)
    asm.RETURN()


def generate_worker():
    from jit import asm
    from jit.build import generate

    argument = asm.Argument(asm.ptr(asm.uint8_t), "slot")
    return generate("pool_worker_loop", "avx2", WORKER_SIGNATURE, (argument,), lambda: _emit_worker(argument))


def generate_fork_join():
    from jit import asm
    from jit.build import generate

    arguments = (asm.Argument(asm.ptr(asm.uint8_t), "slots"), asm.Argument(asm.ptr(asm.uint8_t), "jobs"),
                 asm.Argument(asm.int64_t, "n"), asm.Argument(asm.int64_t, "spins"))
    return generate("pool_fork_join", "avx2", FORK_JOIN_SIGNATURE, arguments, lambda: _emit_fork_join(arguments))
