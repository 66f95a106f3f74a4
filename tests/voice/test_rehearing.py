"""``voice/rehearing.py``: the new words of a transcription that re-heard earlier audio."""

from __future__ import annotations

from execstate.voice.rehearing import after_context


def test_the_cut_follows_the_contexts_letters_not_its_words():
    assert after_context("Tell me a long story about trains.", "Tell me along") == "story about trains."
    assert after_context("Wait, stop. Tell me about mountains instead.", "Wait stop") == (
        "Tell me about mountains instead.")
    assert after_context("Quick question: what is 19 times 23?", "Quick question what") == "is 19 times 23?"


def test_a_context_heard_a_little_differently_is_still_cut_off():
    assert after_context("Tell me a long story about trains", "Tell me Stormy, i'm out!") == "trains"
    assert after_context("Could you tell me something nice about?", "Could you tell? Me something nice") == "about?"


def test_a_context_that_was_not_heard_again_cuts_nothing():
    assert after_context("Sure.", "Describe trains for me.") == "Sure."
    garbled = "Oh, mee-ee. Long story about coffee."
    assert after_context(garbled, "Tell me hey") == garbled
    assert after_context("Tell me.", "") == "Tell me."
    assert after_context("", "Tell me") == ""


def test_all_of_it_the_context_is_nothing_new():
    assert after_context("Tell me about trains.", "tell me about trains") == ""
