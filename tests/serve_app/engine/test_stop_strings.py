from serve_app.engine.stop_strings import StopStrings, unsent_text


def feed_all(matcher: StopStrings, pieces: list[str]) -> str:
    return "".join(matcher.feed(piece) for piece in pieces)


def test_text_before_the_first_stop_string_goes_out_and_the_rest_is_dropped():
    matcher = StopStrings(("END", "\n\n"))
    assert feed_all(matcher, ["Hello", " wor", "ld\n", "\nmore"]) == "Hello world"
    assert matcher.stopped and matcher.feed("ignored") == ""


def test_only_a_possible_stop_start_is_held_back_and_flushed_at_the_real_end():
    matcher = StopStrings(("END",))
    assert matcher.feed("the E") == "the "  # "E" may begin END
    assert matcher.feed("x") == "Ex"  # it did not
    assert matcher.feed(" EN") == " "
    assert matcher.flush() == "EN" and not matcher.stopped


def test_a_stop_string_split_across_a_seam_is_found_from_the_carried_text():
    first = StopStrings(("END",))
    sent = first.feed("Hello EN")  # the attempt ends here: a resume or a bucket edge
    assert sent == "Hello "
    carried = unsent_text("Hello EN", len(sent), ("END",))  # the next attempt decodes the tokens already sent
    second = StopStrings(("END",), carried)
    assert second.feed("D and more") == "" and second.stopped


def test_held_back_text_is_not_lost_at_a_seam_when_no_stop_follows():
    first = StopStrings(("END",))
    sent = first.feed("Hello EN")
    second = StopStrings(("END",), unsent_text("Hello EN", len(sent), ("END",)))
    assert sent + second.feed("ough said") == "Hello ENough said"


def test_without_stop_strings_everything_passes_at_once():
    matcher = StopStrings(())
    assert matcher.feed("abc") == "abc" and matcher.flush() == ""
    assert unsent_text("abc", 5, ("END",)) == ""


def test_a_decoding_that_differs_from_the_streamed_text_carries_nothing():
    # e.g. special tokens decoded that the stream skipped: far more than a stop's start
    assert unsent_text("<|im_end|>Hello EN", 8, ("END",)) == ""
