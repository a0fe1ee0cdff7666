"""What one call of a draft model (--draft-model) carries, and where its drafting stops: the numbers the
drafter (engine/spec/model_drafter.py), the room its cache needs (engine/spec/drafts.py) and the tuner's
report share."""

DRAFT_CALL_TOKENS = 512  # rows a draft-model call carries: a long new history is brought level in calls of this many
# drafting stops below this top-token probability: llama.cpp's --spec-draft-p-min (0 in the pinned version, no
# cut; 0.75 in its older ones): a guess that unsure costs a verified row more often than it gains one
P_MIN = 0.75
