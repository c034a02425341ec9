"""What the CLI tests assert of an error: shared by tests/test_cli.py and tests/test_execute_cli.py."""


def one_line_error(r, *words):
    """Exit status 2, one line starting `error:`, no traceback, naming each of `words`."""
    text = r.output.strip()
    assert r.exit_code == 2, r.output
    assert text.startswith("error:") and len(text.splitlines()) == 1 and "Traceback" not in text, r.output
    for word in words:
        assert word in text, (word, text)


# A small llama config.json the CLI tests write and run.
TINY_LLAMA = {
    "model_type": "llama",
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "intermediate_size": 128,
    "vocab_size": 100,
}
