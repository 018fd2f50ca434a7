"""Translation (the paper's task): parallel text in, BLEU, chrF and TER out."""
