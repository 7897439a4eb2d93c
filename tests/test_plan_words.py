"""What the plan says before the work: the calibration sample as it will be drawn, and the recovery's memory per
process against the machine's."""
from __future__ import annotations

from fairseq_headprune.compress.options import CompressOptions
from fairseq_headprune.compress.stages.plan import calibration_words, memory_line, recovery_processes


def options(**changes) -> CompressOptions:
    return CompressOptions(out="out", speedup=1.5, gen_subset="test", **changes)


def test_a_subset_smaller_than_the_sample_is_said_to_be_read_whole():
    assert calibration_words(options(calibration_sentences=1000), 300) == (
        "all 300 sentences of 'train' (it holds no more than --calibration-sentences)")
    assert calibration_words(options(calibration_sentences=1000), 29000) == (
        "1000 of the 29000 sentences of 'train' drawn at random (seed 1)")


def test_the_recovery_memory_is_counted_per_process_against_what_is_available():
    assert recovery_processes(options()) == 1
    assert recovery_processes(options(recover_args=("--distributed-world-size", "4"))) == 4
    assert recovery_processes(options(recover_args=("--lr", "1e-4", "--distributed-world-size=2"))) == 2
    line = memory_line(100_000_000, 2, 8 * 2**30)  # 100M parameters: 20 bytes each, 1.9 GiB a process
    assert line.startswith("recovery memory: at most 1.9 GiB a process") and "x 2 process(es), against 8.0 GiB" in line
    assert "more than is available" not in line
    assert "more than is available" in memory_line(100_000_000, 16, 8 * 2**30)
    assert memory_line(1_000_000, 1, None) == ("recovery memory: at most 19 MiB a process (student with gradients and "
                                               "Adam's moments, teacher; activations besides) x 1 process(es)")
