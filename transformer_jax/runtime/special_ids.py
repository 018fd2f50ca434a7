"""The special token ids of the shared SentencePiece vocabulary, in one place.

Padding is 0 (masks treat it as "no token"), end of sentence 1 (every source and target ends
with it; beam search stops on it), unknown 2. The tokenizer trains its vocabulary with these ids
(data/tokenizer.py); the model, the masks and the decoders read them from here.
"""

PAD_ID = 0
EOS_ID = 1
UNK_ID = 2
