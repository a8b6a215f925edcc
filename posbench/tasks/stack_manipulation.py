"""Stack manipulation (DeepMind's suite, deterministic context-free)."""

from __future__ import annotations

import random

from posbench.tasks.registry import register_task
from posbench.tasks.transduction import Transduction, bits

POP, PUSH_0, PUSH_1 = 2, 3, 4


@register_task("stack_manipulation")
class StackManipulation(Transduction):
    """``stack actions SEP final_stack END``: a binary stack given bottom to top, then actions
    POP (2), PUSH 0 (3), PUSH 1 (4) executed left to right (a POP on an empty stack does
    nothing); the answer is the final stack top to bottom, closed by END.

    Vocabulary: 0, 1, POP, PUSH 0, PUSH 1, SEP, PAD, END. The length is the number of question
    tokens (stack plus actions; the stack takes 1..n-1 of them); the answer takes up to n + 1
    tokens with END, as DeepMind's output of n + 1 with a termination token; padding after END
    is not scored (their accuracy mask). As google-deepmind/neural_networks_chomsky_hierarchy
    tasks/dcf/stack_manipulation.py.
    """

    family = "context-free"

    n_symbols = 5
    ends = True
    length_unit = "stack and action tokens"

    def answer_length(self, length: int) -> int:
        return length + 1

    def sample(
        self, length: int, batch_size: int, rng: random.Random
    ) -> tuple[list[list[int]], list[list[int]]]:
        questions, answers = [], []
        for _ in range(batch_size):
            if length == 1:
                stack: list[int] = bits(rng, 1)
                questions.append(list(stack))
                answers.append(list(stack))
                continue
            stack = bits(rng, rng.randint(1, length - 1))
            actions = [rng.randint(POP, PUSH_1) for _ in range(length - len(stack))]
            final = list(stack)
            for action in actions:
                if action == POP:
                    if final:
                        final.pop()
                else:
                    final.append(action - PUSH_0)
            questions.append(stack + actions)
            answers.append(final[::-1])
        return questions, answers
