import sys

from engine_patches.gpu_check.report import main

sys.exit(main())
