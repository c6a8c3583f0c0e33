import sys

from engine.cli import main

# guarded: the factory's worker processes (spawn) import the main module again
if __name__ == "__main__":
    sys.exit(main())
