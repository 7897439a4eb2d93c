"""fairseq's own assertions and exceptions about the user's input, as the one-line errors of this package.

fairseq checks some option values only where it uses them, with a bare `assert` or `Exception` deep in a batch
iterator or the beam search (`--max-tokens` smaller than a sentence: an AssertionError in the compiled
batch_by_size, about 40 lines of traceback). Those failures are the user's input, not a bug: `user_message` knows
each of them by its exception type and fairseq's own message, and names the option to change. Anything it does not
know keeps its traceback.
"""
from __future__ import annotations

import re
from typing import Callable, Optional, Sequence, Tuple, Type

from fairseq_headprune.errors import UserError

# (exception type, fairseq's message, our line built from the match)
KNOWN: Sequence[Tuple[Type[BaseException], str, Callable[[re.Match], str]]] = (
    (AssertionError, r"Sentences lengths should not exceed max_tokens=(\S+)",
     lambda m: f"--max-tokens {m.group(1)} is smaller than a sentence of the data (fairseq batches whole sentences, "
               "source or target tokens): raise --max-tokens or leave it out and give --batch-size"),
    (Exception, r"Size of sample #(\d+) is invalid \(=(.*)\) since max_positions=(.*), skip this example",
     lambda m: f"sentence {m.group(1)} of the data is longer (={m.group(2)}) than the model's positions "
               f"({m.group(3)}); fairseq-generate stops here too: shorten the data, or give "
               "--skip-invalid-size-inputs-valid-test (the studies then refuse a subset they cannot score whole)"),
    (AssertionError, r"min_len cannot be larger than max_len",
     lambda m: "--min-len is larger than the longest hypothesis allowed (--max-len-a x source length + --max-len-b, "
               "capped by the model's positions): lower --min-len or raise --max-len-a/--max-len-b"),
    (AssertionError, r"--temperature must be greater than 0",
     lambda m: "--temperature must be greater than 0"),
)


def user_message(error: BaseException) -> Optional[str]:
    """The one-line message for a fairseq failure caused by the user's input, or None for any other error."""
    if isinstance(error, UserError):
        return str(error)
    text = re.sub(r"np\.\w+\((-?\d+)\)", r"\1", str(error))  # numpy 2 prints sizes as np.int32(9)
    for kind, pattern, message in KNOWN:
        match = re.search(pattern, text)
        if isinstance(error, kind) and match:
            return message(match)
    return None


def as_user_error(error: BaseException) -> Optional[UserError]:
    message = user_message(error)
    return None if message is None else UserError(message)
