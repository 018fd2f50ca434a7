"""The special token ids of the shared SentencePiece vocabulary, in one place.

Padding 0 (masks read it as "no token"), end of sentence 1 (every sequence ends with it; beam
search stops on it), unknown 2. The tokenizer trains its vocabulary with these ids.
"""

PAD_ID = 0
EOS_ID = 1
UNK_ID = 2
