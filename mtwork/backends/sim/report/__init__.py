"""What the runtime recorded, turned into what a person reads: the sanitizer's findings
at the author's lines (`findings`, `places`, `symbolizer`), a dispatch's log (`logs`) and
the profiler's `Counters` (`profiling`).

Uses `run/` (the runtime's records), `compile/` and `count/` (where a line came from)."""
