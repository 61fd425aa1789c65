module kandev.dev/node-probe

go 1.24
