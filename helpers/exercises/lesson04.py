"""The check of exercise 04-predict-time (lesson 04, `04_where_time_goes`): an op's regime and the least
time the roofline model gives it, against lesson 04's own rule (`helpers.regimes.classify`); a wrong
time is matched to the mistake (the sum of the three times, no overhead, units swapped).
"""

from __future__ import annotations

from collections.abc import Callable

from helpers.exercises.core import Wrong, close, unpack

__all__ = ["predict_time"]


_REGIMES = ("compute", "memory", "overhead")  # the names of lesson 04 (helpers.regimes.REGIMES)
_TIME_CASES = (  # flops, bytes, peak FLOP/s, bandwidth bytes/s, overhead s per call
    (1e12, 1e9, 1e13, 1e12, 1e-5),  # 0.1 s compute
    (1e9, 1e11, 1e13, 1e12, 1e-5),  # 0.1 s memory
    (1e5, 1e5, 1e13, 1e12, 1e-5),  # 10 µs overhead
    (4e9, 4e6, 2e14, 3e12, 5e-6),  # 20 µs compute
    (1e6, 5e7, 2e14, 3e12, 5e-6),  # 17 µs memory
)


def _expected_regime(flops: float, bytes_: float, peak: float, bw: float, over: float) -> str:
    from helpers.regimes import classify  # lesson 04's own rule: the largest of the three times

    return classify(flops, bytes_, 1, peak_flops=peak, bandwidth=bw, overhead_s=over)


def _diagnose_time(case: str, seconds: float, terms: dict[str, float]) -> None:
    (compute, memory, over), want = terms.values(), max(terms.values())
    if close(seconds, sum(terms.values()), 1e-6):
        raise Wrong("sum", f"{case}: {seconds:g} s is the sum of the three times",
                    "the roofline model's bound is the largest of the three, not their sum (which assumes "
                    "that nothing overlaps)")
    if close(seconds, max(compute, memory), 1e-6) and over == want:
        raise Wrong("no-overhead", f"{case}: {seconds:g} s leaves out the overhead of {over:g} s",
                    "every call costs at least its fixed overhead (dispatch, launch): take it into the max")
    raise Wrong("seconds", f"{case}: {seconds:g} s, expected {want:g} s",
                "the time is at least the largest of FLOPs ÷ peak FLOP/s, bytes ÷ bandwidth and the "
                "overhead")


def predict_time(answer: Callable) -> str:
    """04-predict-time: answer(flops, bytes_moved, peak_flops, bandwidth, overhead_s) -> (regime, seconds)."""
    from helpers.regimes import roof_times  # lesson 04's own times at the roofs

    for flops, bytes_, peak, bw, over in _TIME_CASES:
        terms = roof_times(flops, bytes_, 1, peak_flops=peak, bandwidth=bw, overhead_s=over)
        want_regime = _expected_regime(flops, bytes_, peak, bw, over)
        regime, seconds = unpack(answer(flops, bytes_, peak, bw, over), 2, "regime, seconds")
        if isinstance(regime, (int, float)) and isinstance(seconds, str):
            raise Wrong("order", "it returned (seconds, regime)", "return (regime, seconds)")
        if regime not in _REGIMES:
            raise Wrong("regime-name", f"regime {regime!r}", f"answer one of {_REGIMES}, lesson 04's names")
        case = f"{flops:g} FLOPs, {bytes_:g} bytes on {peak:g} FLOP/s, {bw:g} B/s, {over:g} s per call"
        # the units mistake: the two roofs swapped (FLOPs over the bandwidth, bytes over the FLOP/s)
        swapped = roof_times(flops, bytes_, 1, peak_flops=bw, bandwidth=peak, overhead_s=over)
        if close(seconds, max(swapped.values()), 1e-6) and \
                not close(seconds, terms[want_regime], 1e-6):
            raise Wrong("units", f"{case}: {seconds:g} s divides FLOPs by bandwidth or bytes by FLOP/s",
                        "compute time = FLOPs ÷ peak FLOP/s; memory time = bytes ÷ bandwidth")
        if not close(seconds, terms[want_regime], 1e-6):
            _diagnose_time(case, seconds, terms)
        if regime != want_regime:
            raise Wrong("regime", f"{case}: {regime}, expected {want_regime}",
                        "the regime is the term that sets the bound: the largest of the three")
    return f"regime and time bound right in {len(_TIME_CASES)} cases: compute-, memory- and overhead-bound"
