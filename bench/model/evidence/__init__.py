"""What the evidence says: published SGLang measurements (corpus) replayed through the model (validate), the
model's factors fitted to them with leave-one-source-out error (fit), 80 % intervals on predictions from those
errors per regime (interval), and intervals of measured figures: repeats (confidence), one sweep's resampled
requests (bootstrap), A/B pass rates on the same problems (paired)."""

from bench.model.evidence import bootstrap, confidence, corpus, fit, interval, paired, validate
from bench.model.evidence.bootstrap import StageSample, cell_gain, stage_sample
from bench.model.evidence.confidence import Interval, behind_said, gain_interval, gain_words, mean_interval
from bench.model.evidence.paired import Paired, Verdict, drop_gate, paired_difference

__all__ = ["bootstrap", "confidence", "corpus", "fit", "interval", "paired", "validate", "StageSample", "cell_gain",
           "stage_sample", "Interval", "behind_said", "gain_interval", "gain_words", "mean_interval", "Paired",
           "Verdict", "drop_gate", "paired_difference"]
