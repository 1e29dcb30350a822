"""The one exception type meant for users."""


class MetalgenError(Exception):
    """An error caused by the user's input or environment (a missing file, a bad flag, an
    unknown model type, a prompt past the context...).

    Its message is a single line that says what is wrong and, where it helps, what to do.
    The CLI prints it and exits with status 1; every other exception is a bug.
    """

    def __init__(self, message: str):
        # Keep the one-line promise even when a message is built from foreign text.
        super().__init__(" ".join(str(message).split()))
