module kandev.dev/e2e/apiproxy

go 1.24
