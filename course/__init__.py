"""The course's own machinery, apart from the library (`helpers`): each lesson's set-up and sizes, its
claim tables and figures, the exercises and their solutions, the scripts lessons launch, the notebook runner.
It imports the library; the library never imports it."""
