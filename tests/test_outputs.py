"""An output that would destroy an input: `merge` and `report` refuse it before they read anything."""

import os
import stat

import pytest

from paralab import cli
from paralab.config import ConfigError
from paralab.outputs import check_output_reads_no_input
from paralab.trace import COMPUTE, Span, Trace

INPUT = "not read: a refusal comes before any input is read"


@pytest.fixture
def traces(tmp_path):
    """A folder of two ranks' files and a trace file beside it, whose text a read would reject (so a
    refusal that names the output proves nothing was read)."""
    folder = tmp_path / "out3"
    folder.mkdir()
    for name in ("rank00000.json", "rank00001.json"):
        (folder / name).write_text(INPUT)
    for name in ("run.json", "sim.json"):
        (tmp_path / name).write_text(INPUT)
    os.link(tmp_path / "run.json", tmp_path / "hard-link.json")
    return tmp_path


@pytest.mark.parametrize("argv, message", [
    (["merge", "{tmp}/out3", "-o", "{tmp}/out3/rank00001.json"],
     "-o {tmp}/out3/rank00001.json is inside {tmp}/out3, the trace to read, where it would be read as "
     "one more rank's trace; write it elsewhere"),
    # a new file there too: the next merge of the folder would read it as one more rank
    (["merge", "{tmp}/out3", "-o", "{tmp}/out3/merged.json", "--chrome"], "is inside {tmp}/out3"),
    (["merge", "{tmp}/run.json", "-o", "{tmp}/out3/../run.json"],
     "-o {tmp}/out3/../run.json is the trace to read, which writing it would overwrite"),
    (["report", "{tmp}/run.json", "-o", "{tmp}/run.json"], "-o {tmp}/run.json is the trace to read"),
    (["report", "{tmp}/run.json", "--predicted", "{tmp}/sim.json", "-o", "{tmp}/sim.json"],
     "-o {tmp}/sim.json is the --predicted trace to read"),
    (["report", "{tmp}/hard-link.json", "-o", "{tmp}/run.json"], "is the trace to read"),
    (["report", "{tmp}/out3", "-o", "{tmp}/out3/rank00000.json"], "is inside {tmp}/out3"),
], ids=["merge over a rank", "merge into the folder", "merge over its file", "report over its trace",
        "report over its prediction", "report over a hard link", "report over a rank"])
def test_an_output_that_is_an_input_exits_2_before_anything_is_read(traces, capsys, argv, message):
    """Had overwritten the input (rc 0): rank 1's file with the merge, the trace with HTML."""
    code = cli.main([arg.format(tmp=traces) for arg in argv])
    err = capsys.readouterr().err
    assert code == 2 and message.format(tmp=traces) in err and err.count("\n") == 1, err
    written = [path for path in traces.rglob("*.json") if path.read_text() != INPUT]
    assert written == [] and not (traces / "out3" / "merged.json").exists()


@pytest.mark.parametrize("output", ["{tmp}/merged.json", "{tmp}/out3/report.html", "{tmp}/out3/sub/t.json"])
def test_an_output_beside_the_inputs_passes(traces, output):
    """Beside the folder, or in it but not read as a rank (an HTML report, a sub-folder's file)."""
    check_output_reads_no_input(output.format(tmp=traces), [("trace", str(traces / "out3")),
                                                            ("--predicted trace", None)])


def test_an_output_that_is_no_regular_file_is_refused_and_a_link_is_written_through(traces, capsys):
    """A trace is written beside its path and renamed over it, which replaces what the path names:
    `-o /dev/null`, run as root, had replaced the machine's /dev/null with a trace; a pipe had become a
    file and a symbolic link a file of its own, its target left as it was."""
    pipe = traces / "pipe.json"
    os.mkfifo(pipe)
    assert cli.main(["merge", str(traces / "out3"), "-o", str(pipe)]) == 2
    err = capsys.readouterr().err
    assert f"output {pipe} is not a regular file (a device, pipe or socket)" in err and err.count("\n") == 1
    trace = Trace(spans=[Span(0, COMPUTE, "forward", 0.0, 1.0)])
    with pytest.raises(ConfigError, match="is not a regular file"):
        trace.save(pipe)  # from Python too, where no command checked the path first
    assert stat.S_ISFIFO(pipe.stat().st_mode)
    link = traces / "link.json"
    link.symlink_to(traces / "sim.json")
    trace.save(link)
    assert link.is_symlink() and Trace.load(traces / "sim.json").spans == trace.spans
