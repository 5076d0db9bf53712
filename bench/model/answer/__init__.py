"""What we answer: the one headline a plan's question gets, the same in the CLI's first screen, at the top of the
Planner and in every report's first section (headline)."""

from bench.model.answer.headline import Headline, Saving, make_headline

__all__ = ["Headline", "Saving", "make_headline"]
