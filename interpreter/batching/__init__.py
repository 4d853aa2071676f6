"""Several sessions in one step: token rows and each op's rule on the token axis."""
