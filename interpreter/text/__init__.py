"""Text from a stranger's file: the embedded tokenizer and chat template, checked and
sandboxed (bounded memory and time) before anything runs."""
