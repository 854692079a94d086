"""What every stage shares and nothing else: user-facing errors and their exit code, the command-line conventions,
atomic file writes, the rank/world resolver and small typed-config helpers.

It sits below all four packages (`elasticbert`, `data_prep`, `pretrain`, `finetune`) and imports none of them, nor
torch: `data_prep` workers start without loading the model stack.
"""

from .interrupts import quiet_while_starting as _quiet_while_starting

_quiet_while_starting()  # Ctrl-C while one of our programs imports its libraries: one line, exit 130
