"""paralab.text: generated sentences printed in lines a notebook cell shows whole, counts said in
the singular for one."""

from paralab.text import at_commas, count_text, numbered, steps_said


def test_a_long_sentence_breaks_after_its_commas_within_the_width():
    sentence = ", ".join(f"part {k} of the layout" for k in range(12))
    lines = at_commas(sentence, head="best: ", indent="      ", width=60).split("\n")
    assert all(len(line) <= 60 for line in lines) and len(lines) > 1
    assert lines[0].startswith("best: part 0") and all(line.startswith("      part") for line in lines[1:])
    assert all(line.rstrip().endswith(",") for line in lines[:-1])  # each break after a comma
    assert " ".join(line.strip() for line in lines).replace("best: ", "") == sentence


def test_a_short_sentence_is_left_whole_and_a_long_word_run_breaks_at_spaces():
    assert at_commas("tp 8, pp 16") == "tp 8, pp 16"
    long = "word " * 40
    assert all(len(line) <= 50 for line in at_commas(long.strip(), width=50).split("\n"))


def test_steps_are_said_as_a_range_a_list_or_their_ends():
    assert steps_said([3]) == "step 3"
    assert steps_said([1, 2, 3, 4, 5]) == "steps 1-5"
    assert steps_said([2, 5, 9]) == "steps 2, 5, 9"
    assert steps_said(list(range(0, 46, 2))) == "steps 0, 2, 4 ... 40, 42, 44 (23 steps)"


def test_counts_and_numbered_lists_are_said_in_the_singular_for_one():
    assert count_text(1, "rank") == "1 rank" and count_text(1024, "GPU") == "1,024 GPUs"
    assert count_text(1, "microbatch", "microbatches") == "1 microbatch"
    assert count_text(4, "microbatch", "microbatches") == "4 microbatches"
    assert numbered("rank", [3]) == "rank 3" and numbered("rank", [2, 3]) == "ranks 2, 3"
    assert numbered("rank", list(range(10))) == "ranks 0, 1, 2, 3, 4, 5, 6, 7 and 2 more"
