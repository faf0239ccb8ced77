"""``cairn plot`` and ``cairn goodput -o`` against a real run: two workers, one killed with
SIGKILL mid-run, a restart, checkpoints deleted by ``num_to_keep``. The run and the images
come from docs/images/render.py, the script that draws the images of docs/plots.md."""

from __future__ import annotations

import importlib.util
import json
import re
import struct
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from matplotlib.image import imread

from cairn._src.cli.main import main
from cairn._src.errors import CairnError
from cairn._src.goodput.timeline import build_timeline
from cairn._src.plots import drawing
from cairn._src.plots.series import build_plot

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "plots.md"


def load(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # the workers unpickle the train function by this name
    spec.loader.exec_module(module)
    return module


# The workers find the module through the driver's sys.path.
sys.path.insert(0, str(ROOT / "docs" / "images"))
render = load(ROOT / "docs" / "images" / "render.py", "render")
doc_schema = load(ROOT / "tests" / "cli" / "doc_schema.py", "plots_doc_schema")


def check_png(path: Path) -> tuple[int, int]:
    """The width and height of a valid PNG file (and it decodes)."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", path
    assert data[12:16] == b"IHDR" and data[-8:-4] == b"IEND"
    width, height = struct.unpack(">II", data[16:24])
    assert imread(str(path)).shape[:2] == (height, width)
    return width, height


def check_schema(document: Any, name: str) -> None:
    blocks = dict(re.findall(r"<!-- schema: ([\w-]+) -->\n```\n(.*?)```", DOC.read_text(),
                             re.S))
    found = doc_schema.problems(document, doc_schema.parse(blocks[name]))
    assert not found, f"{name} JSON does not match docs/plots.md:\n" + "\n".join(found)


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    base = tmp_path_factory.mktemp("plots")
    run, out = render.render(str(base / "images"), str(base / "storage"))
    return run, Path(out)


@pytest.mark.slow
def test_both_images_are_valid_pngs(rendered: tuple[str, Path]) -> None:
    _, out = rendered
    width, height = check_png(out / "plot.png")
    assert width > 600 and height > 400
    width, height = check_png(out / "goodput.png")
    assert width > 600 and height > 200


@pytest.mark.slow
def test_plot_json_of_a_run_with_a_restart(rendered: tuple[str, Path],
                                           capsys: pytest.CaptureFixture[str]) -> None:
    run, _ = rendered
    capsys.readouterr()
    assert main(["plot", run, "--metric", "loss", "--metric", "lr", "--x", "step",
                 "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    check_schema(document, "plot")
    assert document["run"] == "demo" and document["metrics"] == ["loss", "lr"]
    loss = [s for s in document["series"] if s["metric"] == "loss"]
    assert [s["attempt"] for s in loss] == [0, 1]
    # Every attempt its own series: the restart resumed from step 11's checkpoint, so
    # steps 12 and 13 are in both.
    assert loss[0]["x"][:14] == list(map(float, range(14)))
    assert loss[1]["x"] == list(map(float, range(12, 24)))
    assert loss[0]["report"][-1] < loss[1]["report"][0]
    (restart,) = document["restarts"]
    assert restart["attempt"] == 0 and restart["restarted"] is True
    assert restart["resumed_from"] == "checkpoint_000012" and restart["x"] == 12.0
    assert restart["label"] == "rank 1: WorkerProcessError"
    assert restart["errors"][0]["ranks"] == [1]
    assert "SIGKILL" in restart["errors"][0]["message"]
    statuses = {c["dir_name"]: c["status"] for c in document["checkpoints"]}
    kept = sorted(p.name for p in Path(run).iterdir() if p.name.startswith("checkpoint_"))
    # num_to_keep=2 keeps the latest two; the one the restart resumed from only until the
    # attempt committed a newer one (as Ray Train counts them).
    assert sorted(n for n, s in statuses.items() if s == "kept") == kept
    assert len(kept) == 2 and "checkpoint_000012" not in kept
    assert sum(s == "deleted" for s in statuses.values()) == 6


@pytest.mark.slow
def test_plot_on_every_x_axis_and_a_log_scale(rendered: tuple[str, Path], tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    run, _ = rendered
    for x_axis in ("report", "time"):
        out = tmp_path / f"{x_axis}.png"
        assert main(["plot", run, "--metric", "loss", "--x", x_axis, "--log", "-o",
                     str(out)]) == 0
        assert capsys.readouterr().out == f"wrote {out}\n"
        check_png(out)
    assert main(["plot", run, "--metric", "loss", "--x", "time", "--json", "-o",
                 str(tmp_path / "both.svg")]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["x"] == "time" and 0 < document["restarts"][0]["x"]
    assert (tmp_path / "both.svg").read_text().lstrip().startswith("<?xml")
    # Without -o or --json: the text chart.
    assert main(["plot", run, "--metric", "loss"]) == 0
    assert capsys.readouterr().out.startswith("loss: ")


@pytest.mark.slow
def test_goodput_draws_and_summarizes(rendered: tuple[str, Path], tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    run, _ = rendered
    out = tmp_path / "goodput.png"
    capsys.readouterr()
    assert main(["goodput", run, "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert "(2 attempts, 1 failure)" in text and f"wrote {out}" in text
    check_png(out)
    events = [json.loads(line) for p in sorted((Path(run) / "events").iterdir())
              for line in p.read_text().splitlines()]
    timeline = build_timeline(events)
    assert [lane.label for lane in timeline.lanes] == [
        "attempt 0 · rank 0", "attempt 0 · rank 1", "attempt 1 · rank 0", "attempt 1 · rank 1"]
    for lane in timeline.lanes:
        categories = {i.category for i in lane.intervals}
        assert {"training", "checkpoint_stall"} <= categories
        assert ("lost_work" in categories) == (lane.attempt == 0)
        assert ("recovery" in categories) == (lane.attempt == 1)


@pytest.mark.slow
def test_bad_requests_exit_2_naming_what_is_accepted(
        rendered: tuple[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run, _ = rendered
    assert main(["plot", run, "--metric", "accuracy", "-o", str(tmp_path / "a.png")]) == 2
    assert ("cairn plot: error: --metric='accuracy' is not a numeric metric of this run; "
            "metrics: ['loss', 'lr', 'step']") in capsys.readouterr().err
    assert not (tmp_path / "a.png").exists()
    assert main(["plot", run, "--metric", "loss", "-o", str(tmp_path / "a.jpg")]) == 2
    assert "-o=" in capsys.readouterr().err
    assert main(["goodput", run, "-o", str(tmp_path / "a")]) == 2
    assert "must end in one of .png, .svg, .pdf" in capsys.readouterr().err


@pytest.mark.slow
def test_without_matplotlib_the_message_says_what_to_install(
        rendered: tuple[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    run, _ = rendered
    for name in ("matplotlib.figure", "matplotlib.backends.backend_agg"):
        monkeypatch.setitem(sys.modules, name, None)
    assert main(["plot", run, "--metric", "loss", "-o", str(tmp_path / "a.png")]) == 2
    assert ("cairn plot: error: Drawing a chart needs matplotlib, which is not installed: "
            "pip install 'cairn-train[plot]'") in capsys.readouterr().err
    # What needs no drawing still works.
    assert main(["plot", run, "--metric", "loss", "--json"]) == 0
    assert main(["goodput", run]) == 0


def test_drawing_hand_made_data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Many attempts and restarts, checkpoints of every status: the figure is drawn."""
    records, events = [], [{"type": "session_start", "t": 0.0}]
    for attempt in range(12):
        events.append({"type": "attempt_start", "attempt": attempt, "t": attempt * 10.0})
        events.append({"type": "train_start", "attempt": attempt, "t": attempt * 10.0 + 1})
        for step in range(5):
            report = attempt * 5 + step + 1
            records.append({"report_index": report, "attempt": attempt,
                            "time": attempt * 10.0 + 2 + step, "metrics": {"loss": 1 / report},
                            "checkpoint_dir_name": f"checkpoint_{report:06d}"})
            events.append({"type": "commit", "index": report, "t": attempt * 10.0 + 2 + step})
            events.append({"type": "blocked", "rank": step % 3, "seconds": 0.2,
                           "t": attempt * 10.0 + 2 + step})
        events.append({"type": "failure", "attempt": attempt, "t": attempt * 10.0 + 8,
                       "last_commit_t": attempt * 10.0 + 6, "reason": "x" * 400})
    plot = build_plot("many", records, events, {"checkpoint_000060": 60}, ["loss"], log=True)
    drawing.draw_metric_plot(plot, str(tmp_path / "plot.png"))
    check_png(tmp_path / "plot.png")
    timeline = build_timeline(events)
    assert len(timeline.lanes) == 36
    from cairn._src.goodput.summary import summarize

    drawing.draw_timeline(timeline, summarize(events), "many", str(tmp_path / "goodput.pdf"))
    assert (tmp_path / "goodput.pdf").read_bytes().startswith(b"%PDF")
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    with pytest.raises(CairnError, match=r"pip install 'cairn-train\[plot\]'"):
        drawing.draw_metric_plot(plot, str(tmp_path / "again.png"))


def test_text_chart_of_reports_without_times(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """A hand-written run directory: an index, and metrics records with no time."""
    run = tmp_path / "old"
    (run / "metrics").mkdir(parents=True)
    (run / "cairn_run.json").write_text(json.dumps({"version": 1, "checkpoints": []}))
    (run / "metrics" / "segment_000000.jsonl").write_text(
        '{"report_index": 1, "metrics": {"loss": 1.0}}\n'
        '{"report_index": 2, "metrics": {"loss": 0.5}}\n')
    assert main(["plot", str(run), "--metric", "loss", "--x", "time"]) == 0
    assert capsys.readouterr().out == "loss: no report has a value for --x time\n"
    assert main(["plot", str(run), "--metric", "loss"]) == 0
    assert capsys.readouterr().out.startswith("loss: 2 reports, first 1, last 0.5")
