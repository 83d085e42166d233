import sys

from dali_mesh.cli.main import main

sys.exit(main())
