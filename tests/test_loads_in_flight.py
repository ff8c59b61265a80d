"""Loads in flight (`ilp.load_chains`, `Counters.loads_in_flight`): the loads of memory a
lane issues per step of its chain of dependent loads, from small functions whose load
dependencies are known and from profiled kernels; and the latency term's use of it."""

from dataclasses import replace

import mlx.core as mx
import pytest

import mtwork
from bench import gpu_model_claims as claims
from mtwork.backends.sim.count.ilp import load_chains
from mtwork.backends.sim.count.llvm_ir import Module
from mtwork.gpu import Assumptions, Counters, estimate


def in_flight(ir: str, block: str = "entry") -> tuple[int, float]:
    """(loads, loads in flight) of `block` of the only function in `ir`."""
    f = Module(ir).functions[0]
    loads, shares = load_chains(f, lambda ins: True)
    b = next(i for i, blk in enumerate(f.blocks) if blk.label == f"%{block}")
    return loads[b], loads[b] / shares[b]


def function(args: str, *lines: str) -> str:
    return "\n".join([f"define void @f({args}) {{", "entry:", *lines, "  ret void", "}"])


def test_independent_loads_are_all_in_flight_and_a_pointer_chase_one_at_a_time():
    four = function("ptr %a, ptr %b, ptr %c, ptr %d",
                    *(f"  %x{p} = load float, ptr %{p}, align 4" for p in "abcd"))
    assert in_flight(four) == (4, 4.0)
    chase = function("ptr %a", "  %p = load ptr, ptr %a, align 8",
                     "  %q = load ptr, ptr %p, align 8", "  %x = load float, ptr %q, align 4")
    assert in_flight(chase) == (3, 1.0)


def test_loads_of_private_arrays_are_not_memory_loads():
    ir = function("ptr %a", "  %s = alloca [4 x float], align 4",
                  "  store float 1.0, ptr %s, align 4", "  %y = load float, ptr %s, align 4",
                  "  %x = load float, ptr %a, align 4")
    assert in_flight(ir) == (1, 1.0)


def test_a_loop_of_unknown_length_has_its_iteration_s_loads_in_flight():
    # Two independent loads per iteration; the next iteration's addresses do not wait for
    # them, but a loop of unknown length is taken one iteration at a time.
    ir = "\n".join([
        "define void @f(ptr %a, ptr %b, i32 %n) {", "entry:", "  br label %loop", "loop:",
        "  %i = phi i32 [ 0, %entry ], [ %i.next, %loop ]",
        "  %pa = getelementptr inbounds float, ptr %a, i32 %i",
        "  %pb = getelementptr inbounds float, ptr %b, i32 %i",
        "  %x = load float, ptr %pa, align 4", "  %y = load float, ptr %pb, align 4",
        "  %i.next = add i32 %i, 1", "  %done = icmp eq i32 %i.next, %n",
        "  br i1 %done, label %exit, label %loop", "exit:", "  ret void", "}"])
    assert in_flight(ir, "loop") == (2, 2.0)


def profiled_in_flight(name: str, body: str) -> float:
    kernel = mtwork.metal_kernel(name, ["in0", "in1", "in2", "in3"], ["out"], body)
    inputs = [mx.zeros((32,), dtype=mx.uint32) for _ in range(4)]
    kernel(inputs=inputs, grid=(32, 1, 1), threadgroup=(32, 1, 1), output_shapes=[(32,)],
           output_dtypes=[mx.uint32], profile=True, isolate=False)
    c = kernel.last_counters
    assert c.load_issues == c.device_loads  # one SIMD-group, every load a device load
    return c.loads_in_flight


def test_profiled_kernels_measure_independent_and_dependent_loads():
    independent = profiled_in_flight(
        "independent", "uint i = thread_position_in_grid.x;\n"
        "out[i] = in0[i] + in1[i] + in2[i] + in3[i];")
    dependent = profiled_in_flight(
        "dependent", "uint i = thread_position_in_grid.x;\n"
        "out[i] = in3[in2[in1[in0[i]]]];")
    assert (independent, dependent) == (4.0, 1.0)


def test_the_latency_term_uses_the_measure_and_the_assumption_without_it():
    c = claims.gated_delta(True, steps=64, hv=2)
    assert c.loads_in_flight is not None and c.loads_in_flight > 8
    measured = estimate(c, "M5 Max")
    assert measured.occupancy.loads_measured
    assert measured.occupancy.loads_in_flight == c.loads_in_flight
    # The same counts without the measure: Assumptions.loads_in_flight (4) a SIMD-group.
    unmeasured = estimate(replace(c, dependent_loads=0), "M5 Max")
    assert not unmeasured.occupancy.loads_measured
    assert (unmeasured.term("latency").seconds
            == pytest.approx(measured.term("latency").seconds * c.loads_in_flight / 4))
    one = estimate(replace(c, dependent_loads=0), "M5 Max", Assumptions(loads_in_flight=1))
    assert one.term("latency").seconds == pytest.approx(4 * unmeasured.term("latency").seconds)


def test_counters_carry_the_loads_in_flight_and_check_them():
    c = Counters("k", 1, 32, load_issues=12, dependent_loads=3)
    assert c.loads_in_flight == 4.0 and Counters.from_dict(c.to_dict()) == c
    assert (c + c).loads_in_flight == 4.0
    assert Counters("k", 1, 32).loads_in_flight is None
    assert "loads in flight (loads / dependent loads)" in str(c)
    with pytest.raises(ValueError, match="dependent_loads=13 exceeds load_issues=12"):
        replace(c, dependent_loads=13)
