import sys

from hvdtrain.cli.main import main

if __name__ == "__main__":   # `python -m hvdtrain`; importing this module (docs tools, test collectors) trains nothing
    sys.exit(main())
