"""What every stage shares and nothing else: user-facing errors and their exit code, the command-line conventions,
atomic file writes, the rank/world resolver and small typed-config helpers.

It sits below all four packages (`elasticbert`, `data_prep`, `pretrain`, `finetune`) and imports none of them, nor
torch: `data_prep` workers start without loading the model stack.
"""
