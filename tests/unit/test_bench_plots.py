"""--plot: the PNGs are written from benchmark records (Agg backend, no display)."""

from __future__ import annotations

from radixlm.bench.long_prompt import Timeline, timeline_series
from radixlm.bench.plots import plot_bars, plot_serve, plot_timeline


def _record(server: str, conc: int | None, thr: float) -> dict:
    return {"server": server, "max_concurrency": conc, "output_throughput": thr,
            "details": {"success": [True, True, False], "ttfts": [0.1, 0.2, 0.0],
                        "itls": [[0.01, 0.02], [0.03], []]}}


def test_serve_plots(tmp_path) -> None:
    recs = [_record(s, c, t) for s in ("radixlm", "llama-server") for c, t in ((1, 5.0),
                                                                                (None, 9.0))]
    paths = plot_serve(recs, str(tmp_path))
    assert sorted(p.rsplit("/", 1)[1] for p in paths) == [
        "serve_throughput_bars.png", "serve_throughput_vs_concurrency.png",
        "serve_ttft_itl_cdf.png"]
    for p in paths:
        with open(p, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    # One server, one concurrency, no details: nothing to compare or draw.
    assert plot_serve([{k: v for k, v in recs[0].items() if k != "details"}],
                      str(tmp_path / "none")) == []


def test_bar_and_timeline_plots(tmp_path) -> None:
    assert plot_bars(["a", "b"], [1.0, 2.0], "tok/s", "t", str(tmp_path), "bars.png").endswith(
        "bars.png")
    t = Timeline([[0.0, 0.1, 0.9, 1.0]], long_arrival=0.15, long_first_token=0.9,
                 window_end=1.0)
    series, marks = timeline_series({"_timelines": {"chunked": t}})
    assert series["chunked"][0] == [0.1, 0.9, 1.0] and marks["chunked"] == (0.15, 0.9)
    path = plot_timeline(series, marks, str(tmp_path), "timeline.png", "title")
    assert (tmp_path / "timeline.png").stat().st_size > 0 and path.endswith("timeline.png")


def test_soak_result_counts_failures_and_plots(tmp_path) -> None:
    """A leaked slot, an invariant error or a 5xx is a failure; the plot leaves out a
    process seen in fewer than half of the windows (a first start's compiler)."""
    from radixlm.bench.soak import IdleCheck, SoakResult, Window, long_lived_processes, plot_soak

    rss = {"api": 300.0, "scheduler": 1500.0}
    windows = [Window(30.0 * i, {**rss, **({"cc1plus": 900.0} if i == 1 else {})},
                      {"stream:ok": 3}, 1.0, 2.0) for i in range(1, 5)]
    clean = IdleCheck(60.0, 10, 90, 0, 100, None, {"scheduler": 1400.0})
    result = SoakResult({}, windows, [clean], {"stream:ok": 12})
    assert result.failures == 0
    leaked = IdleCheck(120.0, 10, 80, 10, 100, None)
    assert SoakResult({}, windows, [clean, leaked], {"5xx": 1}).failures == 2
    assert long_lived_processes(windows) == ["api", "scheduler"]
    path = plot_soak(result, str(tmp_path / "soak.png"))
    with open(path, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
