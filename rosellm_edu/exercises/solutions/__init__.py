"""Worked solutions to the exercises, one module per chapter; try the exercise before you read them."""
