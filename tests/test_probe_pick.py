"""benchmarks/probe_pick.py: a #define's value picked from decode_step_probe.py logs."""

from benchmarks.probe_pick import pick, read


def _log(path, shapes):
    lines = []
    for shape, rows in shapes.items():
        lines.append(f"\n== {shape}: microseconds per token, pipelined, 256 tokens")
        for label, us, same in rows:
            lines.append(f"  full, greedy, {label:<20}{us:8.1f}")
            lines.append(f"  kernel only, {label:<20}{us - 50:8.1f}")
            tail = "the same bits" if same else "not the same bits"
            lines.append(f"  check, {label:<24}8 steps against the default: largest |logit difference| 0, {tail}")
    path.write_text("\n".join(lines) + "\n")


def test_the_fastest_value_that_keeps_the_bits_and_slows_no_shape_wins(tmp_path):
    log = tmp_path / "probe.txt"
    _log(log, {"a": [("d", 100.0, True), ("x", 98.0, True), ("y", 97.0, False), ("z", 99.0, True), ("D", 100.0, True)],
               "b": [("d", 200.0, True), ("x", 196.0, True), ("y", 190.0, True), ("z", 203.0, True), ("D", 202.0, True)]})
    times, wrong = read([log])
    assert times["a"]["d"] == [100.0] and times["b"]["D"] == [202.0] and wrong == {"y"}
    best, lines = pick(times, wrong, {1: ["x"], 2: ["y"], 3: ["z"]}, ["d", "D"], -0.3, 0.0)
    # y is fastest but changed the bits; z slowed shape b; x is 2.0% and 2.5% faster
    assert best == 1
    assert lines[0].startswith("1: mean -2.24%; a -2.00%, b -2.49%") and "not the same bits: ['y']" in lines[1]
    # past the gate nothing wins; z (a -1.0%, b +1.0%) wins only where one shape may be 1% slower
    assert pick(times, wrong, {1: ["x"]}, ["d", "D"], -3.0, 0.0)[0] == 0
    assert pick(times, wrong, {3: ["z"]}, ["d", "D"], 0.0, 0.0)[0] == 0
    assert pick(times, wrong, {3: ["z"]}, ["d", "D"], 0.0, 1.5)[0] == 3
