package replay

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestBudget(t *testing.T) {
	assert.Equal(t, uint64(50), Budget(0.5, 100))
	assert.Equal(t, uint64(1), Budget(0.1, 0), "never 0, which would mean unlimited")
	assert.Equal(t, uint64(1), Budget(0.1, 5))
	assert.Equal(t, uint64(3366305856), Budget(0.4, 8415764640))
}
