from execstate.cli import main

raise SystemExit(main())
